"""Where each stored answer lives: the worker that answered a Responses API request keeps it
(vLLM stores responses in its own memory), so ``GET /v1/responses/{id}``, its cancel and a
follow-up naming it in ``previous_response_id`` must go back to that worker.

A bounded map, oldest forgotten first: a follow-up to a forgotten id goes to the only
worker that could hold it, or gets a clear 400 (gateway/relays.py, gateway/dispatch.py).
"""

from __future__ import annotations

from collections import OrderedDict


class AnswerHomes:
    """Answer id -> the name of the worker that holds it."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._homes: OrderedDict[str, str] = OrderedDict()

    def remember(self, ident: str, worker: str) -> None:
        self._homes[ident] = worker
        self._homes.move_to_end(ident)
        while len(self._homes) > self._capacity:
            self._homes.popitem(last=False)

    def home(self, ident: str) -> str | None:
        return self._homes.get(ident)

    def __len__(self) -> int:
        return len(self._homes)
