"""Prompt text with a requested token count, built from a fixed word list by a seeded generator.

Common short English words are about one token each for a byte-level BPE tokenizer trained on
English text. `Calibration` holds the measured tokens per word and the fixed overhead (BOS,
chat template) for each endpoint; `loadtests.calibrate` measures it against a worker's
`/tokenize`. Random word order means no two prompts share a long prefix, so vLLM's prefix
cache does not make a repeated workload cheaper than a real one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

_WORD_TEXT = """
    the of and to in is was for on that with as by at from his he it an be are were which this
    or had not but one have first they new who also after their has two her its she all been
    other time there when more into only would years over can we some most may so about many
    used than three made him then them these out such later year where up people before during
    both city while school called no between world state part well under most under known
    being back four could since what life house work day end early film long each through
    high any will game until name same main own those large group based family did number city
    home five war last best three local water right light great small old left open around
    again even still good place south north east west road line music book show side set
    team way point far help hand head just make take come give look find keep run tell turn
    live move play read feel seem call need let put mean love talk ask show went got came said
    did much very too well here now why how each less best near near much like down off once
    king lake hill park river field town land sea sun moon star tree bird fish dog cat horse
    red blue green black white gold dark deep warm cold hot dry wet fast slow hard soft loud
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))


@dataclass(frozen=True)
class EndpointCalibration:
    """count(text of n words) ~= overhead + tokens_per_word * n for one endpoint.

    `words`, when set, is the part of `WORDS` that the endpoint's tokenizer encodes as one
    token each (after a space), so prompts built from it have an exact token count.
    """

    tokens_per_word: float = 1.0
    overhead_tokens: int = 0
    words: tuple[str, ...] = ()


@dataclass(frozen=True)
class Calibration:
    """Per-endpoint word-to-token calibration; `source` says where it was measured."""

    endpoints: dict[str, EndpointCalibration] = field(default_factory=dict)
    source: str = "default (1 token per word)"

    def for_endpoint(self, endpoint: str) -> EndpointCalibration:
        return self.endpoints.get(endpoint, EndpointCalibration())

    def to_json(self, with_words: bool = False) -> dict[str, Any]:
        """JSON form; the vocabulary itself only when `with_words` (else its size)."""
        return {
            "source": self.source,
            "endpoints": {
                k: {
                    "tokens_per_word": v.tokens_per_word,
                    "overhead_tokens": v.overhead_tokens,
                    "vocabulary": len(v.words) or len(WORDS),
                    **({"words": list(v.words)} if with_words else {}),
                }
                for k, v in sorted(self.endpoints.items())
            },
        }


def words_for_tokens(tokens: int, cal: EndpointCalibration) -> int:
    """How many words to send so the request carries about `tokens` prompt tokens."""
    return max(1, round((tokens - cal.overhead_tokens) / cal.tokens_per_word))


def build_text(n_words: int, rng: random.Random, words: tuple[str, ...] = ()) -> str:
    vocab = words or WORDS
    return " ".join(rng.choice(vocab) for _ in range(n_words))


def build_prompt(tokens: int, rng: random.Random, cal: EndpointCalibration) -> str:
    """Prompt text of about `tokens` tokens (as the endpoint counts them)."""
    return build_text(words_for_tokens(tokens, cal), rng, cal.words)
