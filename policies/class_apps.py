"""Which apps use each class lately: whether the per-app pacing cap protects anyone.

The per-app cap (``policies.pacing.WorkerPacer``) holds an app flooding an interactive
class in the gateway's queue so that the class's other apps go first. An app alone in its
class has no one there to give way to: holding it only queues its own requests. In
rag-burst at 2-3x its rates, the chat UI (the only chat app) was held at a cap of 4-10 that
an earlier slow interval had set: its streams slowed in every RAG burst, its requests
queued behind the cap and 4-14% of chat turns came late (gateway queue p99 0.7-1.3 s).
So an app is held to the cap only while another app has sent requests of the same class
within ``window_s`` (a light app between two turns still counts).

Pure: the caller passes the time.
"""

from __future__ import annotations

# Long enough that a light app's pause between requests (the chat UI in noisy-neighbour
# sends 1.5 a second) does not lift the cap off the flood beside it.
SHARING_WINDOW_S = 10.0


class ClassApps:
    """The last time each app sent a request of each class."""

    def __init__(self, window_s: float = SHARING_WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: dict[str, dict[str, float]] = {}  # class -> app -> last arrival

    def arrived(self, cls: str, app: str, now: float) -> None:
        """``app`` sent a request of ``cls`` at ``now``."""
        self._seen.setdefault(cls, {})[app] = now

    def shared(self, cls: str, app: str, now: float) -> bool:
        """Whether another app sent a request of ``cls`` within the window before ``now``
        (apps not seen within it are forgotten)."""
        apps = self._seen.get(cls)
        if not apps:
            return False
        for other in [a for a, t in apps.items() if now - t > self.window_s]:
            del apps[other]
        return any(other != app for other in apps)
