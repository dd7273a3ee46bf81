"""Which kind of machine this is. The CPU build of vLLM depends on the CPU's vector
extensions: on the AVX-512 machines most of the project's results come from it ran 32
streams at ~2,400 tok/s in bfloat16; on an AVX2-only one at 349-383 tok/s in bfloat16 and
1,144-1,192 in float32 (docs/measurements.md, "A box without AVX-512"). So the CPU worker
picks its dtype by it, and every bench summary says which box it was measured on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def describe(cpuinfo: str | None = None) -> dict[str, Any]:
    """CPU model, core count and the vector extensions vLLM's CPU kernels depend on, read
    from /proc/cpuinfo (or the given text); `unknown` where it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(fields.get("flags", "").split())
    return {
        "cpu": fields.get("model name", "unknown"),
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
    }


def has_avx512() -> bool:
    """Whether this machine's CPU has AVX-512 (what picks make run's worker dtype, prefill
    chunk and gateway settings)."""
    return bool(describe()["avx512"])


def line(box: dict[str, Any] | None) -> str:
    """One sentence for a report's header; empty for a summary written before boxes were
    recorded."""
    if not box:
        return ""
    vec = "AVX-512" if box.get("avx512") else "no AVX-512"
    if box.get("avx512_bf16"):
        vec += " with BF16"
    return f"Box: {box.get('cpu', 'unknown')}, {box.get('cores', '?')} cores, {vec}."
