"""Values for the fuzzer (``loadtests/fuzz.py``): JSON rendering that can write what
Python's ``json`` will not (integers with thousands of digits, NaN, nesting thousands deep,
lone surrogates as raw bytes) and Hypothesis strategies for odd field values and odd input
shapes, biased to edges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy

T = TypeVar("T")


@dataclass(frozen=True)
class FuzzConfig:
    """What the generated requests assume about the gateway under test."""

    gen_model: str = "tiny-llama"
    embed_model: str = "minilm"
    key: str | None = None  # the valid API key (None: the gateway needs none)
    body_limit: int = 200_000  # the gateway's limits.max_body_bytes
    classes: tuple[str, ...] = ("voice", "chat", "rag", "embed", "batch")
    vocab: int = 2048  # token ids below this are valid for the generation model
    # False: no request carries `seed`. vLLM 0.32 on CPU kills its engine when a request with
    # `seed` has its prefill split into chunks (a prompt longer than what is left of the
    # step's token budget, 2048 by default): "CPU Generator does not use offset".
    send_seed: bool = True
    rerank_model: str = "tiny-rerank"  # a cross-encoder (rerank and score)


# ---------------------------------------------------------------- JSON rendering


@dataclass(frozen=True)
class Raw:
    """JSON text put into a body as it is (numbers Python cannot print, deep nesting...)."""

    text: str

    def __repr__(self) -> str:
        return f"Raw({clip(self.text, 40)!r})"


class _Drop:
    """A mutation that removes the field."""

    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, saying how long it was."""
    return text if len(text) <= n else f"{text[:n]}...(+{len(text) - n})"


def render(value: object, ascii_only: bool = True) -> bytes:
    """``value`` (JSON values, Raw fragments) as a JSON body. With ``ascii_only`` False,
    non-ASCII is written as UTF-8 and lone surrogates pass through as invalid UTF-8."""
    parts: list[str] = []
    _emit(value, parts, ascii_only)
    return "".join(parts).encode("utf-8", "surrogatepass")


def _emit(v: object, out: list[str], ascii_only: bool) -> None:
    if isinstance(v, Raw):
        out.append(v.text)
    elif isinstance(v, dict):
        out.append("{")
        for i, (k, item) in enumerate(v.items()):
            out.append(", " if i else "")
            out.append(json.dumps(str(k), ensure_ascii=ascii_only) + ": ")
            _emit(item, out, ascii_only)
        out.append("}")
    elif isinstance(v, list | tuple):
        out.append("[")
        for i, item in enumerate(v):
            out.append(", " if i else "")
            _emit(item, out, ascii_only)
        out.append("]")
    else:  # str, int, float (NaN and infinities as JS literals), bool, None
        out.append(json.dumps(v, ensure_ascii=ascii_only))


# ---------------------------------------------------------------- value strategies


def weighted(*options: tuple[int, SearchStrategy[T]]) -> SearchStrategy[T]:
    """One of ``options``, each drawn with its relative weight."""
    pool = [s for w, s in options for _ in range(w)]
    return st.sampled_from(pool).flatmap(lambda s: s)


_WORDS = ["the", "family", "calendar", "says", "soccer", "practice", "moved", "thursday"]
_WORDS += ["dinner", "lamp", "notes", "garden"]
_INT_EDGES = [0, -1, 1, 2, 7, 255, 2**15, 2**31 - 1, 2**31, -(2**31) - 1, 2**53 + 1]
_INT_EDGES += [2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]
_FLOAT_EDGES = [0.0, -0.0, 0.5, 1.5, -1.5, 1e-320, 1e308, -1e308, 2.0**63]
_RAW_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "-0", "0e0", "1.0e-400"]
_RAW_NUMBERS += ["123456789012345678901234567890.5", "1" + "0" * 400 + ".5"]
_ODD_STRINGS = ["", " ", "null", "true", "0", "-1", "1e3", "\x00", "\ud800", "\udfff", "\ufeff"]
_ODD_STRINGS += ["\u202e", "\u2028", "\uffff", "💥", "a\x00b", "\r\n", "<s>", "</s>", "<|user|>"]
_ODD_STRINGS += ["{{ 7*7 }}", "{% raw %}", "%s%n%x", "../../etc/passwd", "\\u0000", "é" * 50]
UNKNOWN_FIELDS = ["foo", "", "__proto__", "Model", "MODEL", "model ", "stream\x00", "max_tokens "]
UNKNOWN_FIELDS += ["request_id", "cache_salt", "guided_json", "structured_outputs", "bad_words"]
UNKNOWN_FIELDS += ["allowed_token_ids", "skip_special_tokens", "return_tokens_as_token_ids"]
UNKNOWN_FIELDS += ["vllm_xargs", "kv_transfer_params", "prompt_embeds", "mm_processor_kwargs"]
UNKNOWN_FIELDS += ["extra_body", "logits_processors", "spaces_between_special_tokens"]


def plain_text() -> SearchStrategy[str]:
    return st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8).map(" ".join)


def odd_text() -> SearchStrategy[str]:
    controls = st.characters(max_codepoint=0x1F) | st.sampled_from("\x7f\u2028\ufeff\ufffe")
    return weighted(
        (3, st.text(max_size=30)),
        (2, st.text(controls, max_size=12)),
        (3, st.sampled_from(_ODD_STRINGS)),
        (
            1,
            st.builds(
                lambda c, n: c * n,
                st.sampled_from(["a", "é", "💥", "\x00", " ", "\ud800"]),
                st.integers(100, 5000),
            ),
        ),
    )


def big_int(cfg: FuzzConfig) -> SearchStrategy[object]:
    """An integer literal with hundreds to tens of thousands of digits (CPython refuses to
    convert more than 4300 digits between str and int)."""
    cap = max(600, min(cfg.body_limit // 2, 200_000))
    digits = weighted(
        (3, st.sampled_from([4299, 4300, 4301, 4302, 5000, 10_000])),
        (2, st.integers(20, 3000)),
        (1, st.integers(3000, cap)),
    )
    return st.builds(
        lambda d, neg, lead: Raw(("-" if neg else "") + lead + "7" * (d - 1)),
        digits,
        st.booleans(),
        st.sampled_from("123456789"),
    )


def nested(cfg: FuzzConfig) -> SearchStrategy[Raw]:
    """Arrays/objects nested hundreds to tens of thousands deep (closed or not)."""
    cap = max(100, cfg.body_limit // 8)
    depth = weighted(
        (3, st.sampled_from([2, 10, 100, 500, 900, 990, 1000, 1100, 2000, 5000, 10_000])),
        (1, st.integers(1, cap)),
    )

    def build(d: int, style: str) -> Raw:
        if style == "array":
            return Raw("[" * d + "]" * d)
        if style == "object":
            return Raw('{"a": ' * d + "1" + "}" * d)
        if style == "mixed":
            return Raw('[{"a": ' * d + "null" + "}]" * d)
        return Raw("[" * d)  # unclosed: also invalid JSON

    styles = weighted((3, st.just("array")), (2, st.just("object")), (1, st.just("mixed")))
    return st.builds(build, depth, styles | st.just("unclosed"))


def scalars(cfg: FuzzConfig) -> SearchStrategy[object]:
    return weighted(
        (2, st.none()),
        (2, st.booleans()),
        (3, st.sampled_from(_INT_EDGES)),
        (2, st.integers()),
        (2, st.floats(allow_nan=False, allow_infinity=False)),
        (1, st.sampled_from(_FLOAT_EDGES)),
        (2, st.sampled_from([Raw(x) for x in _RAW_NUMBERS])),
        (1, big_int(cfg)),
        (4, odd_text()),
        (1, st.sampled_from([cfg.gen_model, cfg.embed_model])),
    )


def weird(cfg: FuzzConfig) -> SearchStrategy[object]:
    """Any JSON value, biased to edges: the value a mutated field gets."""
    keys = st.text(max_size=8) | st.sampled_from(UNKNOWN_FIELDS)
    return st.recursive(
        scalars(cfg),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4),
        max_leaves=8,
    )


def token_ids(cfg: FuzzConfig, odd: bool = False) -> SearchStrategy[list[Any]]:
    if not odd:
        return st.lists(st.integers(0, cfg.vocab - 1), min_size=1, max_size=16)
    ids = weighted(
        (4, st.integers(0, cfg.vocab - 1)),
        (2, st.integers(-5, cfg.vocab * 2)),
        (1, st.sampled_from(_INT_EDGES)),
    )
    return weighted(
        (4, st.lists(ids, max_size=16)),
        (1, st.builds(lambda n, v: [v] * n, st.integers(100, 6000), st.integers(0, cfg.vocab))),
    )


def _maybe(
    draw: DrawFn, body: dict[str, Any], fields: Mapping[str, SearchStrategy[Any]], p: int = 3
) -> None:
    """Add each of ``fields`` with a chance of about ``p`` in 10 (Hypothesis leans on it)."""
    for name, strategy in fields.items():
        if draw(st.integers(0, 9)) < p:
            body[name] = draw(strategy)


def odd_input(endpoint: str, cfg: FuzzConfig) -> SearchStrategy[object]:
    """Odd shapes for ``messages`` / ``prompt`` / ``input``."""
    w = weird(cfg)
    text = plain_text() | odd_text()
    if endpoint in ("chat", "messages"):
        role = weighted(
            (5, st.sampled_from(["user", "assistant", "system"])),
            (2, st.sampled_from(["tool", "developer", "function", "", "USER", "root", "user "])),
            (1, scalars(cfg)),
        )
        image = st.sampled_from(
            [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}},
                {"type": "image_url", "image_url": "data:,"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ]
        )
        part = weighted(
            (4, st.builds(lambda t: {"type": "text", "text": t}, text)),
            (1, st.just({"type": "text"})),
            (1, st.builds(lambda t: {"type": "text", "text": t}, w)),
            (1, image),
            (1, st.builds(lambda t: {"type": t}, text)),
            (1, w),
        )
        content = weighted(
            (5, text), (1, st.none()), (2, st.lists(part, max_size=4)), (1, w), (1, nested(cfg))
        )

        @st.composite
        def message(draw: DrawFn) -> dict[str, Any]:
            m: dict[str, Any] = {}
            if draw(st.integers(0, 9)):
                m["role"] = draw(role)
            if draw(st.integers(0, 9)):
                m["content"] = draw(content)
            extra = {
                "name": text | w,
                "tool_calls": st.lists(w, max_size=2) | w,
                "tool_call_id": text | w,
                "reasoning_content": text,
            }
            _maybe(draw, m, extra, 1)
            return m

        return weighted(
            (6, st.lists(message(), max_size=6)),
            (1, message()),
            (1, st.lists(text, max_size=3)),
            (1, w),
        )
    many = st.lists(text, min_size=20, max_size=200) if endpoint == "embeddings" else st.nothing()
    return weighted(
        (3, text),
        (3, token_ids(cfg, odd=True)),
        (1, st.just([])),
        (1, st.lists(token_ids(cfg, odd=True), max_size=3)),
        (2, st.lists(text | scalars(cfg), max_size=4)),
        (1, st.lists(token_ids(cfg) | plain_text(), min_size=2, max_size=3)),
        (1, many),
        (1, w),
    )


def field_values(endpoint: str, cfg: FuzzConfig) -> dict[str, SearchStrategy[object]]:
    """Per field, the values a mutation may give it (``DROP`` removes it)."""
    w = weird(cfg)
    nums = weighted(
        (3, st.sampled_from([-1, 0, 0.5, 1, 2, 2.1, 100, 1e308, -0.0, "0.5", None])),
        (1, st.sampled_from([Raw(x) for x in _RAW_NUMBERS])),
        (2, w),
    )

    def edges(values: Sequence[object], *more: tuple[int, SearchStrategy[object]]) -> Any:
        return weighted((4, st.sampled_from(list(values))), (2, w), *more)

    # A dropped or null budget makes an otherwise valid request generate up to the context
    # length (seconds on CPU), so those stay rare.
    budget = weighted(
        (4, st.integers(1, 8)),
        (6, st.sampled_from([0, -1, -100, 4097, 100_000, 2**31, 2**63, 10**30, 1.0, 1.5, "8"])),
        (1, st.sampled_from([True, False, [8], {"v": 8}, ""])),
        (2, big_int(cfg)),
        (1, st.sampled_from([Raw(x) for x in _RAW_NUMBERS])),
        (1, st.integers()),
        (1, st.sampled_from([None, DROP, 64, 512])),
    )
    models = [cfg.gen_model, cfg.embed_model, "", "gpt-4o", cfg.gen_model.upper()]
    models += [cfg.gen_model + " ", " " + cfg.gen_model, cfg.gen_model + "\x00", "x" * 300, "*"]
    out: dict[str, SearchStrategy[object]] = {
        "model": edges(models, (2, odd_text())),
        "max_tokens": budget,
        "n": edges(
            [0, -1, 1, 2, 3, 2**31, 2**63, 10**30, 1.0, 2.5, "2", True, None],
            (1, st.integers(1, 4)),
            (1, big_int(cfg)),
            (1, st.sampled_from([16, 64, 128, 256, 1000, 10_000, 1_000_000, 10**9])),
        ),
        "stream": edges([True, False, None, "true", 1, 0, [], {}, "false"]),
        "stream_options": edges(
            [
                {},
                {"include_usage": True},
                {"include_usage": False},
                {"include_usage": None},
                {"include_usage": "yes"},
                {"include_usage": 1},
                {"continuous_usage_stats": True},
                {"include_usage": True, "continuous_usage_stats": True},
                {"unknown": 1},
                [],
                "x",
                None,
                True,
            ]
        ),
        "priority": edges([-(2**63), -1, 0, 1, 10, 2**31, 2**63, "1", 1.5, None]),
        "user": weighted((2, odd_text()), (1, w)),
    }
    if endpoint == "embeddings":
        out.update(
            {
                "input": odd_input(endpoint, cfg),
                "encoding_format": edges(["float", "base64", "", "hex", "FLOAT", None, 1]),
                "dimensions": edges([0, -1, 1, 384, 385, 10**9, None]),
                "truncate_prompt_tokens": edges([-1, 0, 1, 8, 256, 257, 10**9, None]),
            }
        )
        return out
    out.update(
        {
            "temperature": nums,
            "top_p": nums,
            "top_k": edges([-1, 0, 1, 50, 10**6, 2**63, None, 1.5]),
            "min_p": nums,
            "presence_penalty": nums,
            "frequency_penalty": nums,
            "repetition_penalty": nums,
            "seed": edges([-1, 0, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, None, "1"]),
            "stop": weighted(
                (3, st.lists(plain_text() | odd_text(), max_size=5)),
                (1, st.sampled_from(["", [""], [None], 5, "\x00", ["a"] * 100])),
                (2, w),
            ),
            "ignore_eos": edges([True, False, None, "yes", 1]),
            "min_tokens": edges([0, 1, 4, 8, 9, 100, -1, 10**9, None]),
            "logit_bias": weighted(
                (
                    2,
                    st.dictionaries(
                        st.integers(-1, cfg.vocab * 2).map(str) | st.sampled_from(["x", ""]),
                        st.sampled_from([-100, 0, 100, 101, 1e308, "1", None]),
                        max_size=5,
                    ),
                ),
                (1, w),
            ),
            "response_format": edges(
                [
                    {"type": "text"},
                    {"type": "json_object"},
                    {"type": "nope"},
                    {},
                    "json",
                    {"type": "json_schema"},
                    {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
                ]
            ),
            "max_completion_tokens": budget,
            "prompt_logprobs": edges([0, 1, 5, 20, 21, -1, 1000, None]),
        }
    )
    if endpoint in ("rerank", "score"):
        texts = odd_input("embeddings", cfg)
        out.update(
            {
                "query": texts,
                "documents": texts,
                "top_n": edges([0, -1, 1, 3, 2**31, None, "2", 1.5]),
                "text_1": texts,
                "text_2": texts,
                "return_documents": edges([True, False, None, "x"]),
                "truncate_prompt_tokens": edges([-1, 0, 1, 8, 10**9, None]),
            }
        )
        return out
    if endpoint == "responses":
        out.update(
            {
                "input": odd_input("chat", cfg) | odd_input("completions", cfg),
                "max_output_tokens": edges([0, -1, 1, 8, 2**31, 2**63, None, "8", 1.5]),
                "instructions": weighted((2, odd_text()), (1, w)),
                "previous_response_id": edges(["resp_nope", "", None, 5, []]),
                "store": edges([True, False, None, "yes"]),
                "tools": edges([[], [{}], [{"type": "function", "name": "f"}], "x"]),
            }
        )
        return out
    if endpoint == "messages":
        out.update(
            {
                "messages": odd_input("chat", cfg),
                "max_tokens": edges([0, -1, 1, 8, 2**31, 2**63, None, "8", 1.5]),
                "system": weighted((2, odd_text()), (1, w)),
                "tools": edges([[], [{}], [{"name": "f", "input_schema": {}}], "x"]),
            }
        )
        return out
    if endpoint == "chat":
        out.update(
            {
                "messages": odd_input(endpoint, cfg),
                "logprobs": edges([True, False, 0, 1, 5, None, "1"]),
                "top_logprobs": edges([0, 1, 5, 20, 21, -1, 1000, None]),
                "tools": edges(
                    [[], [{}], [{"type": "function"}], [{"type": "function", "function": {}}], "x"]
                ),
                "tool_choice": edges(["auto", "none", "required", {"type": "function"}, "x", 5]),
                "parallel_tool_calls": edges([True, False, "x"]),
                "chat_template": edges(["{{", "{% for %}", "{{ raise_exception('x') }}", "", 5]),
                "chat_template_kwargs": w,
                "add_generation_prompt": edges([True, False, None, "x"]),
                "continue_final_message": edges([True, False, None, "x"]),
            }
        )
    else:
        out.update(
            {
                "prompt": odd_input(endpoint, cfg),
                "logprobs": edges([0, 1, 5, 20, 21, -1, 1000, None, True, "1"]),
                "echo": edges([True, False, None, "x"]),
                "suffix": weighted((1, plain_text()), (1, w)),
                "best_of": edges([0, 1, 2, 3, -1, 10**6, None]),
            }
        )
    return out
