"""``POST /v1/embeddings``: pooling work, coalesced by the gateway (gateway/coalesce.py)."""

from __future__ import annotations

from typing import Any

from hearthgate.gateway.endpoints.spec import Endpoint, FieldType
from hearthgate.gateway.errors import BadRequest


def _bounded_inputs(body: dict[str, Any], max_inputs: int) -> None:
    items = body["input"]
    if not isinstance(items, list):
        return
    token_ids = bool(items) and all(type(v) is int for v in items)
    if not token_ids and len(items) > max_inputs:
        raise BadRequest(f"'input' holds {len(items)} items; at most {max_inputs} per request")


EMBEDDINGS = Endpoint(
    name="embeddings",
    paths=("/v1/embeddings",),
    required=(("input",),),
    types=(FieldType("input", (str, list), "a string or an array"),),
    text_fields=("input",),
    pooling=True,
    batch=True,
    check=_bounded_inputs,
)
