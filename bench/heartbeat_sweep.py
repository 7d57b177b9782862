"""What deciding on heartbeats costs each policy, in the simulator.

The live placer sees each worker as its last heartbeat showed it (every 0.5 s by
default, ``SWITCHYARD_HEARTBEAT_INTERVAL_S``; 0.25 s on the benchmarks' stacks) plus the requests it sent there since; the
simulator, by default, lets a policy see every worker's state at the instant it
decides. ``SimulationConfig.heartbeat_s`` (``switchyard simulate --heartbeat-s``) runs
the simulator the live way. This sweeps the heartbeat period for several policies on one
trace and cluster, at a load near the cluster's capacity where decisions matter, and
prints, per policy and period, the P99 time to first token, the share of requests that
met every objective and the goodput (means over the seeds; a seed draws the predictor's
training sample and the policies' randomness, not the arrivals).

Defaults: the whole Azure conversation trace at 4.6 times its rate (25.4 requests/s,
just past ``jsq``'s capacity at 90 % attainment on these workers, 24.4) on 8 A100
workers.

Run ``python -m bench.heartbeat_sweep [--policies ...] [--heartbeats none,0.05,0.25,0.5,1]
[--seeds N] [--json OUT]``. Every figure is the simulator's (a performance model's
output), not a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from switchyard.policies.registry import make_llm_policy
from switchyard.traces import resolve_trace, scale_load

from research.llm.experiment import ExperimentConfig, simulate_one


def _periods(text: str) -> list[float | None]:
    periods: list[float | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "none":
            periods.append(None)
            continue
        try:
            value = float(part)
        except ValueError:
            raise SystemExit(
                f"--heartbeats: {part!r} is not a period in seconds or 'none'"
            ) from None
        if not value > 0:
            raise SystemExit(f"--heartbeats: a period must be > 0 seconds, got {part}")
        periods.append(value)
    return periods


def _label(period_s: float | None) -> str:
    return "every instant" if period_s is None else f"every {period_s:g} s"


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    trace = resolve_trace(args.trace)
    rows = scale_load(trace, args.load_scale).requests
    periods = _periods(args.heartbeats)
    figures: list[dict[str, Any]] = []
    for name in args.policies.split(","):
        policy = make_llm_policy(name)
        for period_s in periods:
            config = ExperimentConfig(
                trace=trace.name,
                policies=(name,),
                workers=(args.workers,),
                profiles=(args.gpu,),
                heartbeat_s=period_s,
            )
            runs = [
                simulate_one(
                    config,
                    policy,
                    rows,
                    workers=args.workers,
                    load_scale=args.load_scale,
                    predictor_error=0.0,
                    seed=seed,
                )
                for seed in range(args.seeds)
            ]
            figure: dict[str, Any] = {"policy": name, "heartbeat_s": period_s}
            for key in ("ttft_p99_s", "slo_attainment", "goodput_rps", "p99_s"):
                figure[key] = statistics.fmean(run[key] for run in runs)
            figures.append(figure)
            print(
                f"  {name} {_label(period_s)}: TTFT P99 {figure['ttft_p99_s']:.3f} s, "
                f"met {figure['slo_attainment']:.1%}, goodput {figure['goodput_rps']:.2f}/s",
                flush=True,
            )
    return figures


def table(figures: list[dict[str, Any]]) -> str:
    periods: list[float | None] = []
    for figure in figures:
        if figure["heartbeat_s"] not in periods:
            periods.append(figure["heartbeat_s"])
    lines = [
        "| policy | " + " | ".join(f"{_label(p)}: TTFT P99, met" for p in periods) + " |",
        "|---|" + "---:|" * len(periods),
    ]
    for name in dict.fromkeys(f["policy"] for f in figures):
        cells = []
        for period_s in periods:
            f = next(x for x in figures if x["policy"] == name and x["heartbeat_s"] == period_s)
            cells.append(f"{f['ttft_p99_s']:.3f} s, {f['slo_attainment']:.1%}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--load-scale", type=float, default=4.6)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--gpu", default="a100-80gb/llama-2-7b")
    parser.add_argument("--policies", default="jsq,llm-d,gaps,switchyard")
    parser.add_argument("--heartbeats", default="none,0.05,0.25,0.5,1")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = parser.parse_args()
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be at least 1, got {args.seeds}")
    figures = sweep(args)
    print()
    print(table(figures))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "figures": figures}, indent=2
            )
        )
        print(f"\nwritten {args.json}")


if __name__ == "__main__":
    main()
