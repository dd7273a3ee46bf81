"""``POST /v1/score`` (also ``/score``): vLLM's pairwise scores, ``text_1``/``text_2`` or
their newer names (``queries`` with ``documents`` or ``items``, ``data_1``/``data_2``)."""

from hearthgate.gateway.endpoints.spec import Endpoint

SCORE = Endpoint(
    name="score",
    paths=("/v1/score", "/score"),
    required=(("text_1", "queries", "data_1"), ("text_2", "documents", "items", "data_2")),
    text_fields=("text_1", "text_2", "queries", "documents", "items", "data_1", "data_2"),
    pooling=True,
)
