"""SneakPeek estimation speed: one batch of requests through the whole estimate.

Synthetic application: ``--rows`` training rows (default 1,500) of dimension ``--dim``
(64) drawn as Gaussian blobs around ``--classes`` (10) centres, one neighbour index per
kind (flat, ivf, hnsw), a Jeffreys prior and three variants' recalls. Each timed call is
``SneakPeekEstimator.estimate`` on a batch of ``--batch`` (24) requests with ``k`` (5)
neighbours: the neighbour search, the counts, ``theta`` and every variant's expected
accuracy. Batches are drawn before the clock starts; after ``--warmup`` untimed calls,
``--repeats`` (2,000) calls are timed one by one with ``time.perf_counter_ns``.

Run ``python -m bench.estimator_bench [--json OUT]``. Prints median and P99 microseconds
per batch for each index kind, plus the agreement of ivf and hnsw neighbour labels with
the exact (flat) ones. Figures are not asserted anywhere: this is not a timed test.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from switchyard.estimation import (
    INDEX_KINDS,
    NeighbourIndex,
    SneakPeekEstimator,
    dirichlet_alpha,
)


def _percentile_us(samples_ns: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(samples_ns, dtype=np.float64), q)) / 1000.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(scale=3.0, size=(args.classes, args.dim))
    labels = rng.integers(0, args.classes, size=args.rows)
    features = (centres[labels] + rng.normal(size=(args.rows, args.dim))).astype(np.float32)
    query_labels = rng.integers(0, args.classes, size=(args.repeats + args.warmup, args.batch))
    queries = (centres[query_labels] + rng.normal(size=(*query_labels.shape, args.dim))).astype(
        np.float32
    )
    frequencies = np.bincount(labels, minlength=args.classes) / args.rows
    alpha = dirichlet_alpha("jeffreys", frequencies)
    recalls = {
        name: rng.uniform(low, 1.0, size=args.classes)
        for name, low in (("small", 0.5), ("medium", 0.7), ("large", 0.85))
    }

    NeighbourIndex.build(features[:2], labels[:2])  # loads faiss before any clock starts
    results: dict[str, Any] = {}
    exact: np.ndarray[Any, Any] | None = None
    for kind in INDEX_KINDS:
        started = time.perf_counter()
        index = NeighbourIndex.build(features, labels, kind, seed=args.seed)
        build_s = time.perf_counter() - started
        estimator = SneakPeekEstimator(index, alpha, recalls, k=args.k)
        for i in range(args.warmup):
            estimator.estimate(queries[i])
        samples_ns: list[int] = []
        for i in range(args.warmup, args.warmup + args.repeats):
            t0 = time.perf_counter_ns()
            estimator.estimate(queries[i])
            samples_ns.append(time.perf_counter_ns() - t0)
        neighbours = np.sort(
            index.query_labels(queries[: args.warmup].reshape(-1, args.dim), args.k)
        )
        if exact is None:
            exact = neighbours
        results[kind] = {
            "build_ms": build_s * 1000.0,
            "median_us": statistics.median(samples_ns) / 1000.0,
            "p99_us": _percentile_us(samples_ns, 99),
            "label_agreement_with_flat": float((neighbours == exact).mean()),
        }
    return {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "results": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=1500)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args)
    config = report["config"]
    print(
        f"SneakPeek estimate: batch {config['batch']}, k={config['k']}, "
        f"{config['rows']} rows x {config['dim']} dims, {config['repeats']} batches"
    )
    print()
    print("| index | build ms | median us/batch | P99 us/batch | labels = flat |")
    print("|---|---:|---:|---:|---:|")
    for kind, row in report["results"].items():
        print(
            f"| {kind} | {row['build_ms']:.1f} | {row['median_us']:.1f} | "
            f"{row['p99_us']:.1f} | {row['label_agreement_with_flat']:.3f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
