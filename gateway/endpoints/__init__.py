"""The endpoints the gateway schedules: one module per kind, one line each here.

Nothing else in the gateway lists endpoints: the routes, body checks, token estimates,
classification rules (``endpoint:``), streaming readers, the Batch API's endpoints and the
404 that names what is served all come from :data:`ENDPOINTS`. Endpoints relayed without
queueing (``/tokenize``, a stored response's ``GET``...) are listed in gateway/relays.py.
"""

from __future__ import annotations

from hearthgate.gateway.endpoints.chat import CHAT
from hearthgate.gateway.endpoints.completions import COMPLETIONS
from hearthgate.gateway.endpoints.embeddings import EMBEDDINGS
from hearthgate.gateway.endpoints.messages import MESSAGES
from hearthgate.gateway.endpoints.rerank import RERANK
from hearthgate.gateway.endpoints.responses import RESPONSES
from hearthgate.gateway.endpoints.score import SCORE
from hearthgate.gateway.endpoints.spec import Endpoint, EventReader, Seen
from hearthgate.gateway.endpoints.speech import SPEECH
from hearthgate.gateway.endpoints.transcription import TRANSCRIPTION

ENDPOINTS: dict[str, Endpoint] = {
    e.name: e
    for e in (
        CHAT,
        COMPLETIONS,
        EMBEDDINGS,
        RESPONSES,
        MESSAGES,
        RERANK,
        SCORE,
        TRANSCRIPTION,
        SPEECH,
    )
}

# Client path -> the endpoint served there.
BY_PATH: dict[str, Endpoint] = {p: e for e in ENDPOINTS.values() for p in e.paths}

# The Batch API's endpoints (a batch's ``endpoint`` and each line's ``url``).
BATCH_PATHS: dict[str, Endpoint] = {e.path: e for e in ENDPOINTS.values() if e.batch}

__all__ = ["BATCH_PATHS", "BY_PATH", "ENDPOINTS", "Endpoint", "EventReader", "Seen"]
