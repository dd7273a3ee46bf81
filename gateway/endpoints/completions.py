"""``POST /v1/completions``: OpenAI's legacy completions (Continue's fill-in-the-middle)."""

from hearthgate.gateway.endpoints.chunks import ChunkReader
from hearthgate.gateway.endpoints.spec import Endpoint, FieldType

COMPLETIONS = Endpoint(
    name="completions",
    paths=("/v1/completions",),
    required=(("prompt",),),
    types=(FieldType("prompt", (str, list), "a string or an array"),),
    text_fields=("prompt", "suffix"),
    max_tokens_keys=("max_tokens",),
    reader=ChunkReader,
    ask_usage=True,
    batch=True,
    tokenize_key="prompt",
)
