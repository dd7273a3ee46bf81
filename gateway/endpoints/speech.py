"""``POST /v1/audio/speech``: text to speech, on a worker of role ``speech`` (any
OpenAI-compatible speech server: vLLM-Omni, Speaches, Kokoro-FastAPI...). The answer is
audio, relayed to the client as it arrives; its first byte is the request's first token in
the metrics and SLO figures. Charged by the characters to speak."""

from __future__ import annotations

from hearthgate.gateway.endpoints.spec import Costed, Endpoint, FieldType


def cost(parsed: Costed) -> tuple[int, int]:
    text = parsed.body.get("input")
    return (len(text) if isinstance(text, str) else 1), 0


SPEECH = Endpoint(
    name="speech",
    paths=("/v1/audio/speech",),
    required=(("input",),),
    types=(
        FieldType("input", (str,), "a string"),
        FieldType("voice", (str, dict), "a string"),
        FieldType("speed", (int, float), "a number"),
    ),
    text_fields=("input",),
    audio_out=True,
    cost=cost,
)
