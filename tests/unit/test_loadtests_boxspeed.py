"""`hearthgate bench box` prints this box's figures beside the results' box."""

from __future__ import annotations

from hearthgate.loadtests.boxspeed import REFERENCE, render


def test_the_report_puts_each_figure_beside_the_reference() -> None:
    result = {
        "box": {"cpu": "AMD EPYC", "cores": 2, "avx512": False},
        "worker_args": ["--dtype", "float32"],
        "figures": {
            "short_ttft_ms": 22.6,
            "short_ms_per_token": 8.15,
            "long_ttft_ms": 66.7,
            "tok_s_32": 1192,
        },
    }
    md = render(result)
    head = "Box: AMD EPYC, 2 cores, no AVX-512.\nWorker flags: ['--dtype', 'float32']"
    assert md.startswith(head)
    assert "| 600-word prompt alone: TTFT p50 | 66.7 ms | 200 ms |" in md
    assert f"| 1192 | {REFERENCE['tok_s_32']} |" in md
    assert "Worker flags: none" in render({**result, "worker_args": []})
