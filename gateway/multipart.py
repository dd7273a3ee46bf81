"""Multipart form bodies (speech-to-text uploads): read into fields and files, and written
again for the worker.

Both run in a thread (``asyncio.to_thread``): a 25 MB upload parsed on the event loop would
stall every stream it relays. The body is already bounded (``limits.max_audio_bytes``) and
in memory when it is parsed.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header

from hearthgate.gateway.errors import BadRequest


@dataclass(frozen=True)
class Upload:
    """One file part of a form."""

    name: str  # the form field ("file")
    filename: str
    content_type: str
    data: bytes


@dataclass
class Form:
    """A parsed form: text fields (the last value of a repeated name wins, as servers
    read forms) and file parts, in order."""

    fields: dict[str, str] = field(default_factory=dict)
    files: list[Upload] = field(default_factory=list)


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` content type; BadRequest otherwise."""
    if not content_type:
        raise BadRequest("expected a multipart/form-data body (Content-Type is missing)")
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data":
        raise BadRequest(f"expected a multipart/form-data body, got {kind.decode('latin-1')}")
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart/form-data body without a boundary")
    return boundary


def parse_form(raw: bytes, content_type: str | None, max_parts: int = 64) -> Form:
    """Read a whole multipart body. Raises BadRequest for a body that is not a complete
    form, has more than ``max_parts`` parts, or text fields that are not UTF-8."""
    boundary = boundary_of(content_type)
    form = Form()
    parts: list[tuple[dict[bytes, bytes], list[bytes]]] = []
    header: list[bytes] = [b"", b""]  # name, value being read

    def on_part_begin() -> None:
        if len(parts) >= max_parts:
            raise BadRequest(f"form has more than {max_parts} parts")
        parts.append(({}, []))

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][1].append(data[start:end])

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        parts[-1][0][header[0].strip().lower()] = header[1].strip()
        header[0], header[1] = b"", b""

    ended = [False]

    def on_end() -> None:
        ended[0] = True

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_part_data": on_part_data,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_end": on_end,
        },
    )
    try:
        parser.write(raw)
        parser.finalize()
    except BadRequest:
        raise
    except Exception as exc:  # the parser's own errors name what broke
        raise BadRequest(f"multipart body could not be read: {exc}") from None
    if not ended[0]:
        raise BadRequest("multipart body is cut short (no closing boundary)")
    for headers, chunks in parts:
        _, disposition = parse_options_header(headers.get(b"content-disposition", b""))
        name = disposition.get(b"name")
        if name is None:
            raise BadRequest("a form part has no name (Content-Disposition: form-data; name=...)")
        data = b"".join(chunks)
        filename = disposition.get(b"filename")
        if filename is not None:
            ctype = headers.get(b"content-type", b"application/octet-stream")
            form.files.append(
                Upload(
                    name.decode("utf-8", "replace"),
                    filename.decode("utf-8", "replace"),
                    ctype.decode("latin-1"),
                    data,
                )
            )
            continue
        try:
            form.fields[name.decode()] = data.decode()
        except UnicodeDecodeError:
            raise BadRequest(f"form field {name!r} is not UTF-8 text") from None
    return form


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "")


def encode_form(form: Form) -> tuple[bytes, str]:
    """The form as a multipart body and its content type (a fresh boundary)."""
    boundary = "hearthgate-" + secrets.token_hex(16)
    out: list[bytes] = []
    for name, value in form.fields.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{_quoted(name)}"\r\n\r\n'
        out.append(head.encode() + value.encode() + b"\r\n")
    for f in form.files:
        head = (
            f"--{boundary}\r\nContent-Disposition: form-data; "
            f'name="{_quoted(f.name)}"; filename="{_quoted(f.filename)}"\r\n'
            f"Content-Type: {f.content_type}\r\n\r\n"
        )
        out.append(head.encode() + f.data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"
