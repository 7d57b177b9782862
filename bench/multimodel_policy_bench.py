"""Decision time of one multi-model placement update: ``place()`` at 64 workers and 100
models.

Snapshots come from :func:`research.multimodel.scenarios.random_snapshot` (four kinds of
worker, speeds 0.5 to 3, models of varied size, Pareto-skewed demand, a random
placement that fits with some replicas loading and some queues). ``--snapshots`` (50)
different snapshots are drawn before the clock starts; each of ``--repeats`` (5) times
every policy on all of them with ``time.perf_counter_ns`` -- each call on a fresh policy
instance, so ``static-rr`` is timed dealing its initial plan, its costliest update --
and the table shows P50 and P99 over every call. Figures are not asserted.

Run ``python -m bench.multimodel_policy_bench [--policies a,b] [--workers 64]
[--models 100] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
from switchyard.multimodel.policy_registry import make_multimodel_policy, multimodel_policy_names
from switchyard.policies.base import DecisionContext

from research.multimodel.scenarios import random_snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(multimodel_policy_names()))
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--snapshots", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    snapshots = [random_snapshot(rng, args.workers, args.models) for _ in range(args.snapshots)]
    names = [name for name in args.policies.split(",") if name]
    results: dict[str, dict[str, float]] = {}
    print(
        f"place() at {args.workers} workers x {args.models} models, "
        f"{args.snapshots} snapshots x {args.repeats} repeats "
        f"(Python {platform.python_version()}, {platform.machine()})"
    )
    print(f"{'policy':<14}{'P50 ms':>10}{'P99 ms':>10}{'max ms':>10}{'changes':>10}")
    for name in names:
        samples: list[float] = []
        changes: list[int] = []
        for repeat in range(args.repeats):
            for index, snap in enumerate(snapshots):
                policy = make_multimodel_policy(name)
                ctx = DecisionContext(random.Random(index), repeat)
                start = time.perf_counter_ns()
                plan = policy.placement.place(snap, ctx)
                samples.append((time.perf_counter_ns() - start) / 1e6)
                changes.append(len(plan.load) + len(plan.evict))
        p50, p99 = (float(v) for v in np.percentile(samples, [50, 99]))
        results[name] = {
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max(samples),
            "mean_changes": float(np.mean(changes)),
        }
        print(f"{name:<14}{p50:>10.2f}{p99:>10.2f}{max(samples):>10.2f}{np.mean(changes):>10.1f}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"workers": args.workers, "models": args.models, "policies": results}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
