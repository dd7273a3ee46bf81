"""uvicorn's server with the gateway's graceful shutdown on SIGTERM / SIGINT.

On the first signal the gateway starts draining while it still listens: ``/readyz``
answers 503 (a load balancer or compose healthcheck sees it), new and queued requests get
503 with ``Retry-After``, and streams in flight may finish for ``shutdown.drain_s``; then
the rest are cut (an error event and ``[DONE]``) and uvicorn stops. As soon as no request
is open the wait ends early. A second signal stops at once.

SIGHUP reads the settings file again (gateway/reload.py) without stopping anything.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from types import FrameType

import uvicorn

from hearthgate.gateway.core import Gateway

log = logging.getLogger("hearthgate")


class DrainingServer(uvicorn.Server):
    """``on_hangup``: what SIGHUP does (the settings reload), run on the event loop."""

    def __init__(
        self,
        config: uvicorn.Config,
        gateway: Gateway,
        on_hangup: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(config)
        self._gateway = gateway
        self._on_hangup = on_hangup
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        if self._on_hangup is not None:
            self._loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
        try:
            await super().serve(sockets)  # type: ignore[arg-type]
        finally:
            if self._on_hangup is not None:
                self._loop.remove_signal_handler(signal.SIGHUP)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain_task is not None or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        # The signal handler runs outside the event loop: hand over thread-safely.
        self._loop.call_soon_threadsafe(self._start_drain, sig, frame)

    def _start_drain(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain(sig, frame))

    async def _drain(self, sig: int, frame: FrameType | None) -> None:
        gw = self._gateway
        gw.begin_drain()
        deadline = asyncio.get_running_loop().time() + gw.settings.shutdown.drain_s + 2.0
        while len(gw.leases) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        super().handle_exit(sig, frame)
