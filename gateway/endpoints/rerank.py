"""``POST /v1/rerank`` (also ``/rerank``, and ``/v2/rerank`` in Cohere's v2 shape): a
cross-encoder scores each document against the query (Open WebUI's and Continue's
rerankers). Pooling work: no output tokens; the prompt is the query and the documents."""

from hearthgate.gateway.endpoints.spec import Endpoint, FieldType

RERANK = Endpoint(
    name="rerank",
    paths=("/v1/rerank", "/rerank", "/v2/rerank"),
    required=(("query",), ("documents",)),
    types=(
        FieldType("query", (str, dict), "a string"),
        FieldType("documents", (str, list, dict), "an array of documents"),
        FieldType("top_n", (int,), "an integer"),
    ),
    text_fields=("query", "documents"),
    pooling=True,
)
