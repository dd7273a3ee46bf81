"""`hearthgate check --live` against the real vLLM workers of the session (default flags:
the generation worker runs the fcfs policy), through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Workers
from tests.support import REPO, free_port

pytestmark = pytest.mark.e2e


def check_live(tmp_path: Path, workers: list[dict[str, Any]], **extra: Any) -> tuple[int, str]:
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(yaml.safe_dump({"workers": workers, **extra}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hearthgate.gateway.cli",
            "check",
            "--live",
            "--timeout",
            "60",
            str(cfg),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=env,
    )
    out = proc.stdout + proc.stderr
    print(out)  # shown with the test's report
    assert "Traceback" not in out, out
    return proc.returncode, out


def test_settings_that_match_the_workers_pass(workers: Workers, tmp_path: Path) -> None:
    code, out = check_live(
        tmp_path,
        [
            {"name": "gen0", "url": workers.gen.url, "models": ["tiny-llama"]},
            # the same worker under an alias, as apps may know it
            {
                "name": "alias",
                "url": workers.gen.url,
                "models": ["chat"],
                "upstream_models": {"chat": "tiny-llama"},
                "role": "long_prefill",
            },
            {"name": "emb0", "url": workers.embed.url, "models": ["minilm"], "role": "embeddings"},
        ],
    )
    assert code == 0, out
    assert f"gen0 {workers.gen.url}: ok: serves tiny-llama (max_model_len 4096); generates; " in out
    assert "scheduling fcfs (command line of pid" in out
    assert f"emb0 {workers.embed.url}: ok: serves minilm" in out and "; embeds;" in out
    assert out.rstrip().endswith("live check: 3 workers, 0 errors, 0 warnings")


def test_a_priority_claim_and_a_wrong_model_name_are_reported(
    workers: Workers, tmp_path: Path
) -> None:
    code, out = check_live(
        tmp_path,
        [
            {
                "name": "gen0",
                "url": workers.gen.url,
                "models": ["llama-3-8b"],
                "priority_scheduling": True,
            },
            {"name": "emb0", "url": workers.embed.url, "models": ["minilm"], "role": "embeddings"},
        ],
    )
    assert code == 1, out
    assert f"gen0 {workers.gen.url}: PROBLEM" in out
    assert "clients' model 'llama-3-8b' is not served here; the worker serves 'tiny-llama'" in out
    assert "set `upstream_models: {llama-3-8b: tiny-llama}` on worker gen0" in out
    assert "the settings say priority_scheduling: true, but the worker runs the fcfs" in out
    assert "start vLLM with --scheduling-policy priority" in out
    assert f"emb0 {workers.embed.url}: ok" in out
    assert "2 errors" in out


def test_swapped_roles_and_a_short_context_are_reported(workers: Workers, tmp_path: Path) -> None:
    code, out = check_live(
        tmp_path,
        [
            {
                "name": "gen0",
                "url": workers.gen.url,
                "models": ["tiny-llama"],
                "role": "embeddings",
            },
            {"name": "emb0", "url": workers.embed.url, "models": ["minilm"]},
            {
                "name": "lp",
                "url": workers.gen.url,
                "models": ["tiny-llama"],
                "role": "long_prefill",
            },
        ],
        routing={"long_prefill_min_tokens": 4096},
    )
    assert code == 1, out
    assert "has role embeddings, but /v1/embeddings failed (HTTP 404" in out
    assert "has role general, but /v1/completions failed (HTTP" in out
    assert "every prompt routed to this long-prefill worker has at least 4096 tokens" in out
    assert "start vLLM with --max-model-len 4352 or more" in out


def test_a_down_worker_is_reported_without_a_traceback(workers: Workers, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    code, out = check_live(
        tmp_path,
        [
            {"name": "gen0", "url": workers.gen.url, "models": ["tiny-llama"]},
            {"name": "gone", "url": down, "models": ["tiny-llama"]},
        ],
    )
    assert code == 1, out
    assert f"gone {down}: PROBLEM: unreachable" in out
    assert f"not reachable at {down}: ClientConnectorError" in out
    assert f"gen0 {workers.gen.url}: ok" in out
