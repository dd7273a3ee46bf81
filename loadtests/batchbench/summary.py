"""The JSON summary of a `hearthgate bench batch` run: config, layout, settings, rounds,
aggregated results."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hearthgate.loadtests import bench
from hearthgate.loadtests.batchbench.client import _r
from hearthgate.loadtests.batchbench.rates import aggregate
from hearthgate.loadtests.batchbench.rig import ORDER, Plan, Rig


def effective_settings(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway's own view of the parts that matter here (its defaults filled in)."""
    try:
        from hearthgate.gateway.settings import load_settings

        s = load_settings(None, **settings)
    except Exception:  # best effort: the report still has the settings file
        return None
    gen = next((w for w in s.workers if w.role != "embeddings"), None)
    return {
        "batch": s.batch.model_dump(by_alias=True),
        "batch_class": s.classes[s.batch_class()].model_dump(),
        "scheduler": s.scheduler.model_dump(),
        "gen_worker_limits": gen.limits.model_dump() if gen is not None else None,
    }


def build_report(
    plan_: Plan,
    rig: Rig,
    got: dict[str, Any],
    *,
    tag: str,
    command: str,
    wall_s: float,
) -> dict[str, Any]:
    """The JSON summary: config, layout, settings, rounds, aggregated results."""
    rounds = got["rounds"]
    outcomes = got["outcomes"]
    inter: dict[str, Any] = {}
    if outcomes:
        s = bench.build_summary(plan_.inter, got["cal"], got["inter_reqs"], outcomes)
        inter = {
            "scenario": s["scenario"],
            "targets": {
                n: {"interactive": t["interactive"], "classes": t["classes"]}
                for n, t in s["targets"].items()
            },
        }
    lay = rig.layout
    gw_settings = rig.gateway_settings()
    notes = []
    for r in rounds:
        for step in ORDER:
            err = (r.get(step) or {}).get("error")
            if err:
                notes.append(f"round {r['round']} {step}: {err}")
        c_failed = sum(
            int(b.get("failed") or 0) for b in ((r.get("C") or {}).get("per_batch") or {}).values()
        )
        d_failed = int((r.get("D") or {}).get("failed") or 0)
        if c_failed or d_failed:
            tops = [
                e["top_error"]
                for e in ((r.get("D") or {}).get("per_endpoint") or {}).values()
                if e.get("top_error")
            ]
            notes.append(
                f"round {r['round']}: failed lines: C {c_failed}, D {d_failed}"
                + (f" (D: {tops[0]})" if tops else "")
            )
        cov = (r.get("B") or {}).get("batch_coverage")
        if cov is not None and cov < 1:
            notes.append(
                f"round {r['round']} B: the batch ran over {100 * cov:.0f}% of the interactive "
                "arrivals only (it finished early): B understates the batch's effect; use more "
                "--lines or a shorter --duration"
            )
    return {
        "version": 1,
        "kind": "batch",
        "tag": tag,
        "command": command,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),
        "timings": got["timings"],
        "config": {
            "batch": plan_.shape.describe(),
            "endpoints": plan_.shape.endpoints(),
            "repeat": plan_.repeat,
            "order": list(ORDER),
            "concurrency": plan_.concurrency,
            "concurrency_scope": "per worker (both workers at once)",
            "batch_lead_s": plan_.batch_lead_s,
            "poll_interval_s": plan_.poll_interval_s,
            "warmup_lines": plan_.warmup_lines,
            "restart_warmup_s": plan_.restart_warmup_s,
            "interactive_scenario": plan_.inter.name,
            "interactive_flows": [f.label for f in plan_.inter.flows],
        },
        "layout": [
            {
                "what": f"vLLM gen worker (tiny-llama, :{rig.gen.port})",
                "core": lay.gen_worker.core,
                "nice": lay.gen_worker.nice,
                "detail": "OMP threads bound to this core; its API server and EngineCore "
                "processes are not pinned",
            },
            {
                "what": f"vLLM embeddings worker (minilm, :{rig.embed.port})",
                "core": lay.embed_worker.core,
                "nice": lay.embed_worker.nice,
                "detail": "OMP threads bound to this core",
            },
            {
                "what": f"gateway (:{lay.gateway_port}, fresh per measurement)",
                "core": lay.gateway_core,
                "detail": "process pinned",
            },
            {
                "what": "load generator (interactive runs, batch client, D client)",
                "core": lay.client_core,
                "detail": "this process, pinned after the workers started",
            },
            {
                "what": f"Redis (:{rig.redis.port}, {rig.redis.data_dir})",
                "core": lay.client_core,
                "detail": "appendonly everysec; inherits the load generator's pin",
            },
        ],
        "vllm": {
            w.kind: {
                "command": w.command(),
                "env": " ".join(
                    f"{k}={w.environment({}).get(k)}"
                    for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")
                ),
                "ready_after_s": _r(w.ready_after, 1),
            }
            for w in (rig.gen, rig.embed)
        },
        "gateway": {
            "settings": {k: v for k, v in gw_settings.items() if k not in ("listen",)},
            "effective": effective_settings(gw_settings),
        },
        "calibration": got["calibration"],
        "rounds": rounds,
        "results": aggregate(rounds),
        "interactive": inter,
        "notes": notes,
    }
