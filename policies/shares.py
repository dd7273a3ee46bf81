"""Dispatched-token shares per class over each class's current backlog period (min_share)."""

from __future__ import annotations


class ShareLedger:
    """Counts dispatched tokens per class and in total.

    ``open`` starts a class's backlog window (the class queue became non-empty), ``close``
    ends it. ``share`` is the class's part of all tokens dispatched inside its open window.
    A window that is closed again without a dispatch in between leaves nothing behind.
    """

    def __init__(self) -> None:
        self._total = 0
        self._by_class: dict[str, int] = {}
        self._window: dict[str, tuple[int, int]] = {}  # class -> (total, class) at open

    def open(self, cls: str) -> None:
        """Start ``cls``'s backlog window now."""
        self._window[cls] = (self._total, self._by_class.get(cls, 0))

    def close(self, cls: str) -> None:
        """End ``cls``'s backlog window (no-op when none is open)."""
        self._window.pop(cls, None)

    def record(self, cls: str, tokens: int) -> None:
        """``tokens`` of class ``cls`` were dispatched."""
        self._total += tokens
        self._by_class[cls] = self._by_class.get(cls, 0) + tokens

    def share(self, cls: str) -> float | None:
        """``cls``'s share of tokens dispatched in its open window; None when no window is
        open or nothing was dispatched in it yet."""
        start = self._window.get(cls)
        if start is None:
            return None
        total = self._total - start[0]
        if total <= 0:
            return None
        return (self._by_class.get(cls, 0) - start[1]) / total

    def dispatched(self, cls: str) -> int:
        """Tokens of ``cls`` dispatched since the ledger was created."""
        return self._by_class.get(cls, 0)
