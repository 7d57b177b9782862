"""Chunked prefill against whole prefills: TTFT and TPOT P99, capacity, simulator speed.

For ``switchyard`` and ``jsq`` on the first 4,000 requests of the Azure code trace and
of the Mooncake trace, 16 A100/llama-2-7b workers, with chunked prefill off and at 512
and 2,048 tokens per iteration (:mod:`research.llm.chunked`):

1. capacity: the highest offered rate at which 90 % of the requests meet every
   objective (:func:`bench.capacity_eval._run`, the same search and objectives as
   ``make bench-capacity``: 5 s TTFT on Mooncake);
2. TTFT and TPOT P99 at fixed offered rates: each trace at the capacity ``jsq`` and
   ``switchyard`` have without chunking, every setting at the same rate;
3. simulator speed: simulated requests per wall-clock second of the whole Azure
   conversation trace (19,366 requests) on 8 workers at load scales 1 and 8 (as
   ``bench/sim_bench.py``), and of each fixed-rate run above.

One process, one seed a run. ``python -m bench.chunked_prefill_eval [--json OUT]
[--requests N]``; Markdown tables go to stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from switchyard.policies.registry import make_llm_policy
from switchyard.slo import token_slos
from switchyard.traces import head, resolve_trace, scale_load

from bench.capacity_eval import A100, TTFT_OBJECTIVE_S, Search, _run
from research.llm.capacity_run import capacity_cell, held_rps
from research.llm.config import SimulationConfig
from research.llm.experiment import ExperimentConfig, simulate_one
from research.llm.simulator import Simulator

TRACES = ("azure-code", "mooncake")
POLICIES = ("switchyard", "jsq")
SETTINGS: tuple[int | None, ...] = (None, 512, 2048)
WORKERS = 16


def _label(setting: int | None) -> str:
    return "off" if setting is None else str(setting)


def capacity(requests: int) -> list[dict[str, Any]]:
    results = []
    for trace in TRACES:
        for policy in POLICIES:
            for setting in SETTINGS:
                started = time.perf_counter()
                result = _run(
                    Search(trace, WORKERS, policy, (A100,), requests, chunked_prefill=setting)
                )
                result["search_wall_s"] = time.perf_counter() - started
                results.append(result)
    return results


def fixed_load(requests: int, found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    runs = []
    for trace_name in TRACES:
        trace = head(resolve_trace(trace_name), requests)
        for at_policy in ("jsq", "switchyard"):
            (reference,) = (
                r
                for r in found
                if r["trace"].startswith(trace_name)
                and r["policy"] == at_policy
                and r["chunked_prefill"] is None
            )
            rate = held_rps(reference, 0)
            scale = rate / trace.mean_rate_rps
            rows = scale_load(trace, scale).requests
            for policy in POLICIES:
                for setting in SETTINGS:
                    config = ExperimentConfig(
                        trace=trace.name,
                        policies=(policy,),
                        workers=(WORKERS,),
                        profiles=(A100,),
                        token_slos=token_slos(ttft_s=TTFT_OBJECTIVE_S.get(trace_name)),
                        chunked_prefill_tokens=setting,
                    )
                    run = simulate_one(
                        config,
                        make_llm_policy(policy),
                        rows,
                        workers=WORKERS,
                        load_scale=scale,
                        predictor_error=0.0,
                        seed=0,
                    )
                    runs.append(
                        {
                            **run,
                            "chunked_prefill": setting,
                            "offered_rps": rate,
                            "at": f"{at_policy}'s capacity, off",
                        }
                    )
    return runs


def speed() -> list[dict[str, Any]]:
    trace = resolve_trace("azure-conv")
    out = []
    for scale in (1.0, 8.0):
        rows = scale_load(trace, scale).requests
        for setting in SETTINGS:
            simulator = Simulator(
                make_llm_policy("jsq"),
                SimulationConfig(workers=8, profiles=(A100,), chunked_prefill_tokens=setting),
            )
            started = time.perf_counter()
            metrics = simulator.run(rows)
            wall_s = time.perf_counter() - started
            iterations = sum(getattr(inst, "iterations", 0) for inst in simulator.instances)
            out.append(
                {
                    "trace": "azure-conv",
                    "requests": len(rows),
                    "load_scale": scale,
                    "policy": "jsq",
                    "chunked_prefill": setting,
                    "wall_s": wall_s,
                    "simulated_rps": metrics.requests / wall_s,
                    "mixed_iterations": iterations,
                    "ttft_p99_s": metrics.ttft_p99_s,
                    "tpot_p99_s": metrics.tpot_p99_s,
                }
            )
    return out


def markdown(
    found: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    speeds: Sequence[dict[str, Any]],
) -> str:
    out = [
        "Capacity (req/s at 90 % SLO attainment), 16 A100 workers:",
        "",
        "| trace | policy | chunked prefill | req/s at 90 % | TTFT P99 s there | "
        "TPOT P99 ms there | most goodput, req/s | search wall s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in found:
        held = r["targets"][0]["held"]
        ttft = "-" if held is None else f"{held['ttft_p99_s']:.2f}"
        tpot = "-" if held is None else f"{held['tpot_p99_s'] * 1000:.0f}"
        out.append(
            f"| {r['trace']} | {r['policy']} | {_label(r['chunked_prefill'])} | "
            f"{capacity_cell(r['targets'][0])} | {ttft} | {tpot} | "
            f"{r['max_goodput']['goodput_rps']:.3g} | {r['search_wall_s']:.1f} |"
        )
    out += [
        "",
        "At fixed offered rates (every setting at the same rate):",
        "",
        "| trace | offered req/s | policy | chunked prefill | TTFT P50 s | TTFT P99 s | "
        "TPOT P50 ms | TPOT P99 ms | TTFT met % | TPOT met % | all met % | simulated req/s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        out.append(
            f"| {r['trace']} | {r['offered_rps']:.3g} ({r['at']}) | {r['policy']} | "
            f"{_label(r['chunked_prefill'])} | {r['ttft_p50_s']:.2f} | {r['ttft_p99_s']:.2f} | "
            f"{r['tpot_p50_s'] * 1000:.1f} | {r['tpot_p99_s'] * 1000:.1f} | "
            f"{r['ttft_attainment'] * 100:.1f} | {r['tpot_attainment'] * 100:.1f} | "
            f"{r['slo_attainment'] * 100:.1f} | {r['simulated_rps']:,.0f} |"
        )
    out += [
        "",
        "Simulator speed, jsq, whole azure-conv trace, 8 workers:",
        "",
        "| load scale | chunked prefill | requests | wall s | simulated req/s | mixed iterations |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for s in speeds:
        out.append(
            f"| {s['load_scale']:g} | {_label(s['chunked_prefill'])} | {s['requests']:,} | "
            f"{s['wall_s']:.2f} | {s['simulated_rps']:,.0f} | {s['mixed_iterations']:,} |"
        )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chunked_prefill_eval")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    found = capacity(args.requests)
    runs = fixed_load(args.requests, found)
    speeds = speed()
    print(markdown(found, runs, speeds))
    total_s = time.perf_counter() - started
    print(f"total wall time {total_s:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "machine": f"{platform.machine()}, CPython {platform.python_version()}",
            "requests": args.requests,
            "workers": WORKERS,
            "ttft_objective_s": TTFT_OBJECTIVE_S,
            "wall_s": total_s,
            "capacity": found,
            "fixed_load": runs,
            "speed": speeds,
        }
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
