"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: speech to text, a
multipart upload (``file``, ``model``, ``response_format``, ``language``, ``stream``...) to a
worker serving a speech-to-text model (vLLM with a Whisper-family model).

Charged by the audio's length, read from the file's header (gateway/audio.py): Whisper's
encoder reads 50 positions a second, and speech is rarely more than 4 tokens a second.
Streamed answers are OpenAI's ``transcription.chunk`` chunks, with a usage chunk when asked
(``stream_include_usage``).
"""

from __future__ import annotations

import math

from hearthgate.gateway.endpoints.chunks import ChunkReader
from hearthgate.gateway.endpoints.spec import Costed, Endpoint

PROMPT_PER_S = 50  # Whisper's encoder: 1,500 positions per 30 s window
OUTPUT_PER_S = 4  # about 150 spoken words a minute, with room
MOST_OUTPUT = 448  # Whisper's decoder length


def cost(parsed: Costed) -> tuple[int, int]:
    seconds = parsed.audio_s or 0.0
    prompt = PROMPT_PER_S * max(1, math.ceil(seconds))
    output = min(MOST_OUTPUT, 16 + math.ceil(OUTPUT_PER_S * seconds))
    if parsed.max_tokens is not None:
        output = min(output, parsed.max_tokens)
    return prompt, output


TRANSCRIPTION = Endpoint(
    name="transcription",
    paths=("/v1/audio/transcriptions", "/v1/audio/translations"),
    required=(),
    max_tokens_keys=("max_completion_tokens",),
    reader=ChunkReader,
    ask_usage=True,
    form=True,
    cost=cost,
)
