"""Checking a Batch API input file before anything of it runs (all or nothing).

Pure functions of the file's text and the limits: an upload is split into lines and each
must be a JSON object (``check_upload``); a batch then checks every line against its
endpoint, the models the gateway serves and the same body checks a live request gets
(``check_batch``). A problem names its line (1-based, as an editor shows it).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from hearthgate.gateway.endpoints import BATCH_PATHS
from hearthgate.gateway.errors import BadRequest
from hearthgate.gateway.parse import decode_json, parse_body

# The endpoints a batch may target, and the kind of request each line is.
BATCH_ENDPOINTS = {path: e.name for path, e in BATCH_PATHS.items()}

# How many problems one 400 lists before it says "and N more".
_SHOWN = 5


@dataclass(frozen=True)
class LineProblem:
    line: int  # 1-based
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class InvalidFile(BadRequest):
    """A file or batch refused before anything ran; ``problems`` name their lines."""

    def __init__(self, problems: list[LineProblem], what: str) -> None:
        shown = "; ".join(str(p) for p in problems[:_SHOWN])
        more = len(problems) - _SHOWN
        tail = f" (and {more} more)" if more > 0 else ""
        super().__init__(f"{what}: {shown}{tail}", code="invalid_batch_file")
        self.problems = problems


@dataclass(frozen=True)
class BatchLine:
    """One checked line: its ``custom_id`` and the request body, compact JSON."""

    index: int  # 0-based position among the file's lines
    custom_id: str
    body: str


def split_lines(content: bytes, max_bytes: int, max_lines: int) -> tuple[list[str], bool]:
    """The file's lines (without their newlines) and whether it ended with a newline.
    Raises :class:`InvalidFile` for a file over the limits, not UTF-8, or with a line that
    is empty or not a JSON object."""
    if len(content) > max_bytes:
        raise BadRequest(
            f"file is {len(content)} bytes; batch.max_file_bytes is {max_bytes}",
            code="file_too_large",
        )
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"file is not UTF-8 text (byte {exc.start})") from None
    trailing = text.endswith("\n")
    lines = text.split("\n")
    if trailing:
        lines.pop()
    # CRLF files keep their "\r" (JSON reads it as white space), so a download matches.
    if not any(line.strip() for line in lines):
        raise BadRequest("file is empty; expected one JSON request per line")
    if len(lines) > max_lines:
        raise BadRequest(
            f"file has {len(lines)} lines; batch.max_lines is {max_lines}",
            code="too_many_lines",
        )
    problems = []
    for i, line in enumerate(lines):
        if not line.strip():
            problems.append(LineProblem(i + 1, "empty line"))
            continue
        try:
            value = json.loads(line)
        except RecursionError:  # nesting deeper than the parser's stack
            problems.append(LineProblem(i + 1, "not valid JSON (nests too deep)"))
            continue
        except ValueError as exc:
            problems.append(LineProblem(i + 1, f"not valid JSON ({exc})"))
            continue
        if not isinstance(value, dict):
            problems.append(LineProblem(i + 1, "not a JSON object"))
    if problems:
        raise InvalidFile(problems, "the file is not valid batch input")
    return lines, trailing


def _check_line(
    index: int,
    line: str,
    endpoint: str,
    models: Collection[str],
    max_body_bytes: int,
    limits: tuple[int, int, int],
) -> BatchLine:
    """One line, or BadRequest with the reason."""
    value = decode_json(line.encode(), limits[0])
    if not isinstance(value, dict):
        raise BadRequest("not a JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BadRequest("'custom_id' must be a non-empty string")
    method = value.get("method")
    if method != "POST":
        raise BadRequest(f"'method' must be \"POST\", got {json.dumps(method)}")
    url = value.get("url")
    if url != endpoint:
        raise BadRequest(f"'url' is {json.dumps(url)}; this batch's endpoint is {endpoint}")
    body = value.get("body")
    if not isinstance(body, dict):
        raise BadRequest("'body' must be a JSON object")
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    size = len(raw.encode())
    if size > max_body_bytes:
        raise BadRequest(f"'body' is {size} bytes; limits.max_body_bytes is {max_body_bytes}")
    parsed = parse_body(raw.encode(), BATCH_ENDPOINTS[endpoint], *limits)
    if parsed.stream:
        raise BadRequest("'stream': true is not supported in a batch")
    if parsed.model not in models:
        raise BadRequest(
            f"model '{parsed.model}' does not exist; available: {', '.join(sorted(models))}"
        )
    return BatchLine(index, custom_id, raw)


def check_batch(
    lines: list[str],
    endpoint: str,
    models: Collection[str],
    max_body_bytes: int,
    max_json_depth: int = 64,
    max_n: int = 8,
    max_inputs: int = 2048,
) -> list[BatchLine]:
    """Every line checked for a batch on ``endpoint``: all good, or :class:`InvalidFile`
    listing the problems (a missing or repeated ``custom_id``, another ``url``, a
    streaming request, an unknown model, a body over the limit, what a live request with
    that body would get 400 for)."""
    if endpoint not in BATCH_ENDPOINTS:
        raise BadRequest(
            f"endpoint {endpoint!r} is not supported; use one of {', '.join(BATCH_ENDPOINTS)}",
            code="invalid_endpoint",
        )
    limits = (max_json_depth, max_n, max_inputs)
    out: list[BatchLine] = []
    problems: list[LineProblem] = []
    seen: dict[str, int] = {}
    for i, line in enumerate(lines):
        try:
            checked = _check_line(i, line, endpoint, models, max_body_bytes, limits)
        except BadRequest as exc:
            problems.append(LineProblem(i + 1, exc.message))
            continue
        first = seen.setdefault(checked.custom_id, i + 1)
        if first != i + 1:
            problems.append(
                LineProblem(i + 1, f"custom_id {checked.custom_id!r} repeats line {first}")
            )
            continue
        out.append(checked)
    if problems:
        raise InvalidFile(problems, "the input file cannot run as a batch")
    return out
