"""The GAPS evaluation: every LLM policy on both Azure traces, 4 to 32 workers, three
seeds, predictor error 0 to 40 %, plus a mixed-GPU cluster and the parameter sweeps
behind the defaults of ``u_th`` and of the calibration (beta, gamma, eps).

Load: the trace's arrivals are sped up by ``load_per_8 * workers / 8``, so every
cluster size sees the same load per worker (conversation x4.5 and code x2 per 8
workers by default: busy, short of the knee where every policy collapses together).
Each run replays the first 6,000 requests of the trace (``--quick``: 2,000). Policies
that use no prediction (and the oracle, which uses the truth) run once per
seed; the predictive ones once per predictor error.

Run ``make bench-eval`` or ``python -m bench.gaps_eval [--quick] [--json OUT]``; the
Markdown tables go to stdout. ``--quick`` runs a 2,000-request head of each trace on
4 and 8 workers, one seed (a smoke run of the script itself).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from switchyard.policies import PolicyOptions, make_llm_policy
from switchyard.policies.gaps import GapsAssignmentConfig
from switchyard.policies.registry import PredictionUse, llm_policy_names
from switchyard.prediction import CalibrationConfig
from switchyard.traces import head, resolve_trace, scale_load

from research.llm import SimulationConfig, Simulator

A100 = "a100-80gb/llama-2-7b"
L40S = "l40s-48gb/llama-2-7b"
ERRORS = (0.0, 0.2, 0.4)
REQUESTS = 6000
"""Requests from the start of each trace: the whole grid in about 20 minutes on 2 cores."""
LOAD_PER_8 = {"azure-conv": 4.5, "azure-code": 2.0}


@dataclass(frozen=True)
class Job:
    section: str
    trace: str
    workers: int
    load_scale: float
    policy: str
    seed: int
    error: float
    profiles: tuple[str, ...] = (A100,)
    u_th: float | None = None
    calibration: tuple[float, float, float] | None = None
    head: int | None = None


def _uses_prediction(policy: str) -> bool:
    return make_llm_policy(policy).prediction is PredictionUse.CALIBRATED


def _run(job: Job) -> dict[str, Any]:
    trace = resolve_trace(job.trace)
    if job.head is not None:
        trace = head(trace, job.head)
    rows = scale_load(trace, job.load_scale).requests
    options = PolicyOptions()
    if job.u_th is not None:
        options = replace(options, gaps=GapsAssignmentConfig(utilization_threshold=job.u_th))
    calibration = CalibrationConfig()
    if job.calibration is not None:
        beta, gamma, eps = job.calibration
        calibration = replace(calibration, beta=beta, gamma=gamma, eps=eps)
    config = SimulationConfig(
        workers=job.workers,
        profiles=job.profiles,
        predictor_error=job.error,
        calibration=calibration,
        seed=job.seed,
    )
    metrics = Simulator(make_llm_policy(job.policy, options), config).run(rows).to_json()
    metrics.pop("latency_quantiles_s", None)
    return {**job.__dict__, "trace_name": trace.name, **metrics}


def _jobs(quick: bool) -> list[Job]:
    seeds = (0,) if quick else (0, 1, 2)
    sizes = (4, 8) if quick else (4, 8, 16, 32)
    cut = 2000 if quick else REQUESTS
    jobs: list[Job] = []
    for trace, per_8 in LOAD_PER_8.items():
        for workers in sizes:
            scale = per_8 * workers / 8
            for seed in seeds:
                for policy in llm_policy_names():
                    errors = ERRORS if _uses_prediction(policy) else (0.0,)
                    for error in errors:
                        jobs.append(
                            Job("grid", trace, workers, scale, policy, seed, error, head=cut)
                        )
    mixed = (A100, L40S)
    for seed in seeds:
        for policy in llm_policy_names():
            for error in (0.0, 0.2) if _uses_prediction(policy) else (0.0,):
                jobs.append(
                    Job("mixed", "azure-conv", 8, 3.0, policy, seed, error, mixed, head=cut)
                )
                jobs.append(
                    Job(
                        "mixed-overload", "azure-conv", 8, 4.5, policy, seed, error, mixed, head=cut
                    )
                )
        for u_th in (0.0, 0.3, 0.5, 0.7, 1.0):
            for profiles, scale in (((A100,), 4.5), (mixed, 3.0)):
                for error in (0.0, 0.4):
                    jobs.append(
                        Job(
                            "u_th",
                            "azure-conv",
                            8,
                            scale,
                            "gaps-norebal",
                            seed,
                            error,
                            profiles,
                            u_th=u_th,
                            head=cut,
                        )
                    )
        for calibration in (
            (0.0, 0.0, 0.0),
            (1.0, 1.0, 0.2),
            (0.0, 0.0, 0.2),
            (1.0, 1.0, 0.0),
            (2.0, 2.0, 0.2),
            (1.0, 1.0, 0.5),
        ):
            for error in (0.2, 0.4):
                jobs.append(
                    Job(
                        "calibration",
                        "azure-conv",
                        8,
                        4.5,
                        "gaps",
                        seed,
                        error,
                        calibration=calibration,
                        head=cut,
                    )
                )
    return jobs


def _mean(runs: Sequence[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


def _grid_tables(runs: list[dict[str, Any]]) -> str:
    out: list[str] = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        if r["section"] == "grid":
            groups[(r["trace_name"], r["workers"])].append(r)
    out.append("### P99 latency (s) at predictor error 0, mean of the seeds\n")
    names = llm_policy_names()
    out.append(
        "| trace | workers | load | "
        + " | ".join(names)
        + " | best baseline | gaps / best | gaps / oracle |"
    )
    out.append("|---|---:|---:|" + "---:|" * (len(names) + 3))
    for (trace, workers), group in sorted(groups.items()):
        p99 = {}
        for name in names:
            runs_of = [r for r in group if r["policy"] == name and r["error"] == 0.0]
            p99[name] = _mean(runs_of, "p99_s")
        baselines = {n: v for n, v in p99.items() if n != "oracle" and not n.startswith("gaps")}
        best = min(baselines, key=baselines.__getitem__)
        out.append(
            f"| {trace} | {workers} | x{group[0]['load_scale']:g} | "
            + " | ".join(f"{p99[n]:.2f}" for n in names)
            + f" | {best} | {p99['gaps'] / baselines[best]:.2f} | {p99['gaps'] / p99['oracle']:.2f} |"
        )
    out.append("\n### SLO violation rate (%) at predictor error 0\n")
    out.append("| trace | workers | " + " | ".join(names) + " |")
    out.append("|---|---:|" + "---:|" * len(names))
    for (trace, workers), group in sorted(groups.items()):
        cells = []
        for name in names:
            runs_of = [r for r in group if r["policy"] == name and r["error"] == 0.0]
            cells.append(f"{100 * _mean(runs_of, 'slo_violation_rate'):.1f}")
        out.append(f"| {trace} | {workers} | " + " | ".join(cells) + " |")
    out.append("\n### Predictor error: P99 (s) of the predictive policies, 8 workers\n")
    out.append(
        "| trace | policy | "
        + " | ".join(f"{int(e * 100)} %" for e in ERRORS)
        + " | migrations at 0 % |"
    )
    out.append("|---|---|" + "---:|" * (len(ERRORS) + 1))
    for (trace, workers), group in sorted(groups.items()):
        if workers != 8:
            continue
        for name in names:
            if not _uses_prediction(name):
                continue
            cells = [
                f"{_mean([r for r in group if r['policy'] == name and r['error'] == e], 'p99_s'):.2f}"
                for e in ERRORS
            ]
            migrations = _mean(
                [r for r in group if r["policy"] == name and r["error"] == 0.0], "migrations"
            )
            out.append(f"| {trace} | {name} | " + " | ".join(cells) + f" | {migrations:.0f} |")
    return "\n".join(out)


def _section_table(runs: list[dict[str, Any]], section: str, keys: Sequence[str]) -> str:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        if r["section"] == section:
            groups[tuple(str(r[k]) for k in keys)].append(r)
    out = [f"| {' | '.join(keys)} | P50 s | P99 s | SLO violations % | migrations |"]
    out.append("|" + "---|" * len(keys) + "---:|---:|---:|---:|")
    for key, group in sorted(groups.items()):
        out.append(
            f"| {' | '.join(key)} | {_mean(group, 'p50_s'):.2f} | {_mean(group, 'p99_s'):.2f} "
            f"| {100 * _mean(group, 'slo_violation_rate'):.1f} | {_mean(group, 'migrations'):.0f} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every run here as JSON")
    args = parser.parse_args()
    jobs = _jobs(args.quick)
    # Longest first, so the pool does not end on one big run.
    jobs.sort(key=lambda j: -j.workers)
    runs: list[dict[str, Any]] = []
    with mp.get_context("spawn").Pool(args.processes) as pool:
        for i, run in enumerate(pool.imap_unordered(_run, jobs), 1):
            runs.append(run)
            if i % 25 == 0 or i == len(jobs):
                print(f"  {i}/{len(jobs)} runs", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    print(_grid_tables(runs))
    print("\n### Mixed cluster: 4 A100 + 4 L40S, conversation x3\n")
    print(_section_table(runs, "mixed", ("policy", "error")))
    print("\n### Mixed cluster overloaded: 4 A100 + 4 L40S, conversation x4.5\n")
    print(_section_table(runs, "mixed-overload", ("policy", "error")))
    print("\n### u_th sweep (gaps-norebal, conversation, 8 workers)\n")
    print(_section_table(runs, "u_th", ("profiles", "error", "u_th")))
    print("\n### Calibration sweep (gaps, conversation x4.5, 8 workers): (beta, gamma, eps)\n")
    print(_section_table(runs, "calibration", ("error", "calibration")))


if __name__ == "__main__":
    main()
