"""Simulator and policy speed, single process.

1. Simulator speed: simulated requests per wall-clock second for the Azure conversation
   trace (the full trace when ``../shared/traces/azure`` or SWITCHYARD_TRACE_DIR has it,
   else the bundled sample) on 8 A100/Llama-2-7B instances, at load scale 1 and at a
   load scale that overloads the cluster (default 8: the cluster's knee is about 5).
   The clock covers ``Simulator.run`` (trace rows in, metrics out), including offline
   predictor training and every policy decision.
2. Policy speed: assignment decisions per second and the P99 time of one decision at 32
   workers, each policy called on a fresh snapshot of 32 workers with random loads (the
   snapshot is built before the clock starts: its cost belongs to the shell).

Run ``make bench-sim`` or ``python -m bench.sim_bench [--repeats N] [--json OUT]``
(``--policies jsq,gaps`` for some of the simulator's policies, ``--decisions 0`` to leave
out the policy speed). Figures are medians over the repeats and go to stdout as Markdown
tables. The simulator runs compiled when ``make native`` has built its hot modules
(:mod:`switchyard.native`); ``--builds compiled,pure`` times both in one sitting, each
repeat a child process per build, the builds alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from switchyard.contracts.messages import WorkloadType
from switchyard.policies import make_llm_policy
from switchyard.policies.base import DecisionContext
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView
from switchyard.traces import resolve_trace, scale_load

import research.llm
from research.llm import SimulationConfig, Simulator

SIM_POLICIES = ("round-robin", "jsq", "llumnix", "splitwise", "gaps", "oracle")
DECISION_POLICIES = (
    "round-robin",
    "random",
    "jsq",
    "power-of-two",
    "least-work",
    "llumnix",
    "flashgen",
    "gaps",
    "oracle",
    "llm-d",
    "kv-router",
    "switchyard",
)
PROFILE = "a100-80gb/llama-2-7b"


def simulator_speed(
    trace: str,
    load_scales: tuple[float, ...],
    repeats: int,
    policies: tuple[str, ...] = SIM_POLICIES,
    first_seed: int = 0,
) -> list[dict[str, Any]]:
    base = resolve_trace(trace)
    figures: list[dict[str, Any]] = []
    for scale in load_scales:
        rows = scale_load(base, scale).requests
        for name in policies:
            policy = make_llm_policy(name)
            rates: list[float] = []
            utilization = 0.0
            for repeat in range(first_seed, first_seed + repeats):
                simulator = Simulator(policy, SimulationConfig(workers=8, seed=repeat))
                started = time.perf_counter()
                metrics = simulator.run(rows)
                rates.append(metrics.requests / (time.perf_counter() - started))
                utilization = metrics.mean_utilization
            figures.append(
                {
                    "trace": base.name,
                    "requests": len(rows),
                    "load_scale": scale,
                    "policy": name,
                    "build": _build(),
                    "simulated_rps_median": statistics.median(rates),
                    "simulated_rps_runs": rates,
                    "mean_utilization": utilization,
                }
            )
            print(
                f"  {base.name} x{scale:g} {name} ({_build()}): "
                f"{statistics.median(rates):,.0f} req/s",
                flush=True,
            )
    return figures


def _build() -> str:
    return "compiled" if research.llm.NATIVE else "pure"


def simulator_speed_by_build(
    args: argparse.Namespace, builds: tuple[str, ...], policies: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Each repeat runs every build in a child process of its own, the builds in turn."""
    runs: dict[tuple[str, float, str], list[float]] = {}
    firsts: dict[tuple[str, float, str], dict[str, Any]] = {}
    for repeat in range(args.repeats):
        for build in builds:
            with tempfile.TemporaryDirectory() as scratch:
                out = Path(scratch) / "figures.json"
                child = [
                    *(sys.executable, "-m", "bench.sim_bench", "--trace", args.trace),
                    *("--load-scales", args.load_scales, "--policies", ",".join(policies)),
                    *("--repeats", "1", "--first-seed", str(repeat), "--decisions", "0"),
                    *("--json", str(out), "--expect-build", build),
                ]
                env = dict(os.environ, SWITCHYARD_NATIVE="0" if build == "pure" else "1")
                subprocess.run(child, env=env, check=True, stdout=subprocess.DEVNULL)
                for figure in json.loads(out.read_text())["simulator"]:
                    key = (build, figure["load_scale"], figure["policy"])
                    runs.setdefault(key, []).extend(figure["simulated_rps_runs"])
                    firsts.setdefault(key, figure)
            print(f"  repeat {repeat + 1} of {args.repeats}, {build}: done", flush=True)
    figures = []
    for key, rates in runs.items():
        figure = dict(firsts[key])
        figure["simulated_rps_runs"] = rates
        figure["simulated_rps_median"] = statistics.median(rates)
        figures.append(figure)
    return figures


def _snapshot(rng: random.Random, workers: int) -> ClusterSnapshot:
    views = tuple(
        WorkerView(
            worker_id=f"w{i:02d}",
            worker_type=PROFILE,
            waiting=rng.randint(0, 20),
            running=rng.randint(0, 64),
            max_slots=256,
            kv_used_tokens=rng.randint(0, 100_000),
            kv_capacity_tokens=117_936,
            queued_work_s=rng.uniform(0.0, 120.0),
            queued_tokens=rng.randint(0, 120_000),
            utilization=rng.uniform(0.2, 1.0),
            decode_step_s=rng.uniform(0.012, 0.06),
            decode_step_per_seq_s=0.00046,
            decode_step_per_kv_token_s=1.2e-7,
            kv_bytes_per_token=524_288,
            interconnect_bytes_per_s=25e9,
        )
        for i in range(workers)
    )
    return ClusterSnapshot(now_s=100.0, workers=views)


def _request(rng: random.Random, i: int, workers: int = 32) -> RequestView:
    service_s = rng.uniform(0.2, 20.0)
    prompt_tokens = rng.randint(16, 4000)
    # A few workers hold a prefix of the prompt in their cache (what the prefix-aware
    # policies weigh); the others read none.
    cached = {f"w{w:02d}": rng.randint(0, prompt_tokens) for w in rng.sample(range(workers), 4)}
    return RequestView(
        request_id=f"r{i}",
        arrival_s=100.0,
        prompt_tokens=prompt_tokens,
        workload=WorkloadType.CONVERSATION,
        model="llama-2-7b",
        predicted_s={PROFILE: service_s},
        calibrated_s={PROFILE: service_s * 1.1},
        deadline_s=100.0 + 1.32 * service_s,
        cached_tokens=cached,
    )


def decision_speed(workers: int, decisions: int, repeats: int) -> list[dict[str, Any]]:
    figures: list[dict[str, Any]] = []
    for name in DECISION_POLICIES:
        assignment = make_llm_policy(name).assignment
        rates: list[float] = []
        p99s_us: list[float] = []
        for repeat in range(repeats):
            rng = random.Random(repeat)
            cases = [(_request(rng, i, workers), _snapshot(rng, workers)) for i in range(decisions)]
            ctx_rng = random.Random(repeat)
            times_ns: list[int] = []
            for sequence, (request, cluster) in enumerate(cases):
                ctx = DecisionContext(ctx_rng, sequence)
                started = time.perf_counter_ns()
                assignment.assign(request, cluster, ctx)
                times_ns.append(time.perf_counter_ns() - started)
            total_s = sum(times_ns) / 1e9
            rates.append(decisions / total_s)
            times_ns.sort()
            p99s_us.append(times_ns[int(0.99 * (len(times_ns) - 1))] / 1e3)
        figures.append(
            {
                "policy": name,
                "workers": workers,
                "decisions_per_s_median": statistics.median(rates),
                "p99_decision_us_median": statistics.median(p99s_us),
            }
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--load-scales", default="1,8", help="comma-separated (default 1,8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--policies",
        default=",".join(SIM_POLICIES),
        help=f"comma-separated simulator policies (default {','.join(SIM_POLICIES)})",
    )
    parser.add_argument(
        "--decisions", type=int, default=20_000, help="per policy; 0 skips the decision speed"
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument(
        "--builds",
        help="compiled,pure: time both builds of the simulator (default: the one that loads)",
    )
    parser.add_argument("--first-seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--expect-build", choices=("compiled", "pure"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    scales = tuple(float(s) for s in args.load_scales.split(","))
    if args.expect_build is not None and args.expect_build != _build():
        parser.error(f"the {args.expect_build} simulator was asked for; run make native")
    builds = tuple(b for b in (args.builds or "").split(",") if b)
    if any(b not in ("compiled", "pure") for b in builds):
        parser.error(f"--builds takes compiled and/or pure, got {args.builds}")

    machine = (
        f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"
    )
    print(f"Simulator speed ({machine}); medians of {args.repeats} runs", flush=True)
    policies = tuple(p for p in args.policies.split(",") if p)
    if builds:
        sim = simulator_speed_by_build(args, builds, policies)
    else:
        sim = simulator_speed(args.trace, scales, args.repeats, policies, args.first_seed)
    decisions = decision_speed(32, args.decisions, args.repeats) if args.decisions > 0 else []

    print(
        "\n| trace | requests | load scale | policy | simulator | simulated requests/s "
        "| utilisation |"
    )
    print("|---|---:|---:|---|---|---:|---:|")
    order = {name: i for i, name in enumerate(policies)}
    for f in sorted(sim, key=lambda f: (f["load_scale"], order[f["policy"]], f["build"])):
        print(
            f"| {f['trace']} | {f['requests']:,} | {f['load_scale']:g} | {f['policy']} "
            f"| {f['build']} | {f['simulated_rps_median']:,.0f} | {f['mean_utilization']:.2f} |"
        )
    if decisions:
        print("\n| policy | workers | decisions/s | P99 decision time |")
        print("|---|---:|---:|---:|")
    for f in decisions:
        print(
            f"| {f['policy']} | {f['workers']} | {f['decisions_per_s_median']:,.0f} "
            f"| {f['p99_decision_us_median']:.1f} µs |"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"machine": machine, "simulator": sim, "decisions": decisions}, indent=2)
            + "\n"
        )


if __name__ == "__main__":
    main()
