"""Calibrate prompt text against a worker's `POST /tokenize`, so prompts have the token
counts the scenario asks for.

1. Every word of the word list is tokenized on its own (after a space, as it appears inside
   a prompt); the words that cost exactly one token form the endpoint's vocabulary.
2. Two texts of different lengths from that vocabulary give the line
   count = overhead + tokens_per_word * words; the overhead is BOS for completions, the chat
   template around a user message for chat, [CLS]/[SEP] for an embeddings model.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp

from hearthgate.loadtests.prompts import WORDS, Calibration, EndpointCalibration, build_text

_SIZES = (50, 400)
_MIN_VOCABULARY = 64  # fewer single-token words than this: keep the whole list


async def _count(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with session.post(
        url.rstrip("/") + "/tokenize", json=body, timeout=aiohttp.ClientTimeout(total=30)
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"/tokenize answered {resp.status}: {(await resp.text())[:200]}")
        data = await resp.json()
        return int(data["count"])


async def single_token_words(
    session: aiohttp.ClientSession, url: str, model: str, concurrency: int = 16
) -> tuple[str, ...]:
    """The words of `WORDS` that the model's tokenizer encodes as one token after a space."""
    sem = asyncio.Semaphore(concurrency)

    async def count(text: str) -> int:
        async with sem:
            return await _count(session, url, {"model": model, "prompt": text})

    # "the" + " word": the first word absorbs BOS/CLS-style overhead and the missing space.
    base = await count("the")
    counts = await asyncio.gather(*(count(f"the {w}") for w in WORDS))
    single = tuple(w for w, c in zip(WORDS, counts, strict=True) if c - base == 1)
    return single if len(single) >= _MIN_VOCABULARY else ()


async def calibrate_endpoint(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    endpoint: str,
    words: tuple[str, ...] = (),
    seed: int = 0,
) -> EndpointCalibration:
    """Fit overhead and tokens per word for one endpoint, with prompts built from `words`."""
    rng = random.Random(f"calibrate:{seed}")
    counts = []
    for n in _SIZES:
        text = build_text(n, rng, words)
        if endpoint == "chat":
            body: dict[str, Any] = {
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "add_generation_prompt": True,
            }
        else:
            body = {"model": model, "prompt": text}
        counts.append(await _count(session, url, body))
    per_word = (counts[1] - counts[0]) / (_SIZES[1] - _SIZES[0])
    if per_word <= 0:
        raise RuntimeError(f"/tokenize counts do not grow with length: {counts}")
    overhead = max(0, round(counts[0] - per_word * _SIZES[0]))
    return EndpointCalibration(
        tokens_per_word=round(per_word, 4), overhead_tokens=overhead, words=words
    )


async def calibrate(
    gen_url: str | None,
    gen_model: str,
    embed_url: str | None = None,
    embed_model: str = "minilm",
    session: aiohttp.ClientSession | None = None,
) -> Calibration:
    """Calibration for chat and completions from `gen_url`, embeddings from `embed_url`.
    Endpoints that cannot be measured keep the default of one token per word."""
    own = session is None
    sess = aiohttp.ClientSession() if session is None else session
    found: dict[str, EndpointCalibration] = {}
    where: list[str] = []
    try:
        if gen_url:
            words = await single_token_words(sess, gen_url, gen_model)
            for ep in ("completions", "chat"):
                found[ep] = await calibrate_endpoint(sess, gen_url, gen_model, ep, words)
            where.append(f"{gen_url}/tokenize")
        if embed_url:
            try:
                words = await single_token_words(sess, embed_url, embed_model)
                found["embeddings"] = await calibrate_endpoint(
                    sess, embed_url, embed_model, "embeddings", words
                )
                where.append(f"{embed_url}/tokenize")
            except (RuntimeError, aiohttp.ClientError, KeyError, ValueError):
                pass  # keep the default for embeddings; their length matters little
    finally:
        if own:
            await sess.close()
    return Calibration(found, source=", ".join(where) or "default (1 token per word)")


def calibration_from_json(data: dict[str, Any]) -> Calibration:
    eps = {
        k: EndpointCalibration(
            float(v["tokens_per_word"]),
            int(v["overhead_tokens"]),
            tuple(str(w) for w in v.get("words", [])),
        )
        for k, v in data.get("endpoints", {}).items()
    }
    return Calibration(eps, source=str(data.get("source", "file")))
