"""``POST /v1/chat/completions``: OpenAI's chat, streamed or not."""

from hearthgate.gateway.endpoints.chunks import ChunkReader
from hearthgate.gateway.endpoints.spec import Endpoint, FieldType

CHAT = Endpoint(
    name="chat",
    paths=("/v1/chat/completions",),
    required=(("messages",),),
    types=(FieldType("messages", (list,), "an array of messages"),),
    # Chat templates render tools, functions and documents into the prompt.
    text_fields=("messages", "tools", "functions", "documents"),
    max_tokens_keys=("max_completion_tokens", "max_tokens"),
    reader=ChunkReader,
    ask_usage=True,
    batch=True,
    tokenize_key="messages",
)
