"""Window-scheduler overhead: wall time of one ``schedule()`` call on a busy window.

Synthetic window, the issue's target case: ``--requests`` (24) requests spread over
``--apps`` (5) applications of 3 variants each (latency and load profiles shaped like
the measured ``logreg-pca4``, ``mlp-small`` and ``mlp-large`` x100, the emulated edge
device of :mod:`switchyard.selection.views`), deadlines 150 +- 30 ms, a sigmoid penalty,
one worker, and SneakPeek-like ``theta`` and expected accuracies on every request (so
data-aware and data-oblivious schedulers see the same window). ``--windows`` (200)
different windows are drawn before the clock starts; each repeat times every scheduler
on all of them (after ``--warmup`` untimed calls) with ``time.perf_counter_ns`` and
keeps the P50 and P99; the table shows the medians over ``--repeats`` (5).

``--collector service`` (the default) runs the garbage collector as the scheduler
service does: the heap settled once (:func:`switchyard.heap.settle_heap`) and each plan
made with the collector paused, its youngest generation collected right after
(:func:`switchyard.heap.collector_paused`; that collection is timed apart and shown).
``--collector unpaused`` settles the heap but plans with the collector running (the
scheduler service before 2026-11-29); ``--collector default`` leaves CPython's collector
as it is, as the figures before 2026-11-29 were taken.

The window search runs compiled when ``make native`` has built the hot modules
(:mod:`switchyard.native`), and the table says which build ran; ``--builds
compiled,pure`` times both in one sitting, each repeat a child process per build, the
builds alternating, and shows every repeat's P99 besides the medians.

Run ``python -m bench.selection_bench [--schedulers a,b] [--json OUT]``. Needs the
scheduler registry (``switchyard.selection.registry``). Figures are not asserted.
"""

from __future__ import annotations

import argparse
import contextlib
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

import numpy as np
from switchyard import native
from switchyard.apps.penalty import Penalty
from switchyard.heap import collector_paused, settle_heap
from switchyard.policies.base import DecisionContext
from switchyard.selection.snapshot import (
    AppView,
    VariantView,
    WindowRequest,
    WindowSnapshot,
    WorkerSlot,
)

# Measured CPU profiles of the bundled variants, x100 (ms per batch of 1..32; load ms):
# turned into seconds below.
_SHAPES_MS: tuple[tuple[str, dict[int, float], float, float], ...] = (
    ("logreg-pca4", {1: 0.6, 2: 0.6, 4: 0.6, 8: 0.7, 16: 0.7, 32: 0.8}, 5.0, 0.85),
    ("mlp-small", {1: 1.8, 2: 1.8, 4: 1.9, 8: 2.0, 16: 2.1, 32: 2.3}, 60.0, 0.95),
    ("mlp-large", {1: 5.0, 2: 6.0, 4: 8.0, 8: 10.0, 16: 15.0, 32: 24.0}, 200.0, 0.97),
)
_SHAPES: tuple[tuple[str, dict[int, float], float, float], ...] = tuple(
    (name, {size: ms / 1e3 for size, ms in latency_ms.items()}, load_ms / 1e3, accuracy)
    for name, latency_ms, load_ms, accuracy in _SHAPES_MS
)


def synthetic_apps(count: int, rng: np.random.Generator) -> dict[str, AppView]:
    """``count`` applications of 3 variants, accuracies and recalls jittered per app."""
    apps: dict[str, AppView] = {}
    penalty = Penalty(kind="sigmoid", steepness_per_s=100.0, midpoint_s=0.05)
    for a in range(count):
        classes = int(rng.integers(2, 11))
        variants = []
        for name, latency, load, accuracy in _SHAPES:
            acc = float(np.clip(accuracy + rng.normal(0, 0.02), 0.5, 0.999))
            recall = tuple(float(r) for r in np.clip(rng.normal(acc, 0.05, classes), 0, 1))
            variants.append(
                VariantView(
                    name=name,
                    latency_s={"cpu": dict(latency)},
                    load_s=load,
                    accuracy=acc,
                    recall=recall,
                )
            )
        name = f"app{a}"
        apps[name] = AppView(
            name=name, num_classes=classes, penalty=penalty, variants=tuple(variants)
        )
    return apps


def synthetic_window(
    apps: dict[str, AppView], requests: int, now_s: float, rng: np.random.Generator
) -> WindowSnapshot:
    names = list(apps)
    items = []
    for i in range(requests):
        app = apps[names[i % len(names)]]
        arrival = now_s - float(rng.uniform(0, 0.1))
        theta = rng.dirichlet(np.full(app.num_classes, 0.5) + np.eye(app.num_classes)[0] * 4)
        expected = {v.name: float(np.dot(theta, v.recall)) for v in app.variants}
        items.append(
            WindowRequest(
                request_id=f"r{i}",
                app=app.name,
                arrival_s=arrival,
                deadline_s=arrival + max(0.001, float(rng.normal(0.15, 0.03))),
                theta=tuple(float(t) for t in theta),
                expected_accuracy=expected,
            )
        )
    items.sort(key=lambda r: r.arrival_s)
    worker = WorkerSlot(
        worker_id="w0", worker_type="cpu", free_at_s=now_s + float(rng.uniform(0, 0.02)),
        loaded=(names[0], "mlp-small"),
    )  # fmt: skip
    return WindowSnapshot(now_s=now_s, requests=tuple(items), apps=apps, workers=(worker,))


def run(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from switchyard.selection.registry import make_window_scheduler, window_scheduler_names
    except ImportError as exc:
        raise SystemExit(
            f"selection_bench: the window schedulers are not available: {exc}"
        ) from None
    names = (
        [n.strip() for n in args.schedulers.split(",") if n.strip()]
        if args.schedulers
        else list(window_scheduler_names())
    )
    rng = np.random.default_rng(args.seed)
    apps = synthetic_apps(args.apps, rng)
    windows = [
        synthetic_window(apps, args.requests, 0.1 * (i + 1), rng) for i in range(args.windows)
    ]
    as_service = args.collector == "service"
    if args.collector != "default":
        settle_heap()
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        scheduler = make_window_scheduler(name)
        p50s: list[float] = []
        p99s: list[float] = []
        collect_p99s: list[float] = []
        for _ in range(args.repeats):
            for i in range(args.warmup):
                scheduler.schedule(windows[i % len(windows)], DecisionContext(random.Random(i)))
            samples = []
            collections = []
            for i, window in enumerate(windows):
                ctx = DecisionContext(rng=random.Random(i), sequence=i)
                with collector_paused() if as_service else contextlib.nullcontext():
                    started = time.perf_counter_ns()
                    scheduler.schedule(window, ctx)
                    decided = time.perf_counter_ns()
                collections.append((time.perf_counter_ns() - decided) / 1e6)
                samples.append((decided - started) / 1e6)
            p50s.append(float(np.percentile(samples, 50)))
            p99s.append(float(np.percentile(samples, 99)))
            collect_p99s.append(float(np.percentile(collections, 99)))
        results[name] = {
            "p50_ms": statistics.median(p50s),
            "p99_ms": statistics.median(p99s),
            "p99_ms_runs": p99s,
            "collection_after_p99_ms": statistics.median(collect_p99s) if as_service else 0.0,
            "data_aware": float(scheduler.data_aware),
        }
    return {
        "config": {
            "requests": args.requests,
            "apps": args.apps,
            "variants_per_app": len(_SHAPES),
            "windows": args.windows,
            "repeats": args.repeats,
            "seed": args.seed,
            "collector": args.collector,
            "build": _build(),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "schedulers": results,
    }


def _build() -> str:
    from switchyard.selection import grouped

    return "compiled" if native.compiled(grouped) else "pure"


def run_by_build(args: argparse.Namespace, builds: list[str]) -> dict[str, Any]:
    """Each repeat runs every build in a child process of its own, the builds in turn."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    config: dict[str, Any] = {}
    for repeat in range(args.repeats):
        for build in builds:
            with tempfile.TemporaryDirectory() as scratch:
                out = Path(scratch) / "figures.json"
                child = [
                    *(sys.executable, "-m", "bench.selection_bench", "--repeats", "1"),
                    *("--requests", str(args.requests), "--apps", str(args.apps)),
                    *("--windows", str(args.windows), "--warmup", str(args.warmup)),
                    *("--seed", str(args.seed), "--collector", args.collector),
                    *("--json", str(out)),
                    *(("--schedulers", args.schedulers) if args.schedulers else ()),
                ]
                env = dict(os.environ, **{native.DISABLE_ENV: "0" if build == "pure" else "1"})
                done = subprocess.run(child, env=env, check=False, stdout=subprocess.DEVNULL)
                if done.returncode != 0:
                    raise SystemExit(
                        f"selection_bench: the {build} run failed (exit {done.returncode})"
                    )
                document = json.loads(out.read_text())
            if document["config"]["build"] != build:
                raise SystemExit(
                    f"selection_bench: asked for the {build} build, "
                    f"{document['config']['build']} ran (make native builds it)"
                )
            config = document["config"]
            for name, row in document["schedulers"].items():
                kept = rows.setdefault((name, build), {"data_aware": row["data_aware"]})
                for field in ("p50_ms", "p99_ms", "collection_after_p99_ms"):
                    kept.setdefault(field + "_runs", []).append(row[field])
            print(f"  repeat {repeat + 1} of {args.repeats}, {build}: done", file=sys.stderr)
    schedulers: dict[str, dict[str, Any]] = {}
    for (name, build), kept in rows.items():
        schedulers[f"{name} ({build})"] = {
            "p50_ms": statistics.median(kept["p50_ms_runs"]),
            "p99_ms": statistics.median(kept["p99_ms_runs"]),
            "p99_ms_runs": kept["p99_ms_runs"],
            "collection_after_p99_ms": statistics.median(kept["collection_after_p99_ms_runs"]),
            "data_aware": kept["data_aware"],
        }
    config = dict(config, repeats=args.repeats, build=",".join(builds))
    return {"config": config, "schedulers": schedulers}


def markdown(document: dict[str, Any]) -> str:
    config = document["config"]
    lines = [
        f"schedule() wall time, {config['requests']} requests, {config['apps']} applications x "
        f"{config['variants_per_app']} variants, 1 worker; medians over {config['repeats']} "
        f"repeats of {config['windows']} windows; collector: {config['collector']}; "
        f"build: {config['build']}",
        "",
        "| scheduler | data-aware | P50 ms | P99 ms | P99 ms of each repeat | "
        "collection after, P99 ms |",
        "|---|---|---:|---:|---|---:|",
    ]
    for name, row in sorted(document["schedulers"].items()):
        aware = "yes" if row["data_aware"] else "no"
        after = row["collection_after_p99_ms"] if config["collector"] == "service" else None
        each = ", ".join(f"{p99:.2f}" for p99 in row["p99_ms_runs"])
        lines.append(
            f"| {name} | {aware} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {each} | "
            f"{'-' if after is None else f'{after:.3f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--schedulers", default=None, help="comma-separated (default: all)")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--apps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--collector",
        choices=("service", "unpaused", "default"),
        default="service",
        help="the garbage collector as the scheduler service runs it, the heap settled "
        "without the pause, or CPython's default (default: %(default)s)",
    )
    parser.add_argument(
        "--builds",
        default=None,
        help="compiled,pure: time both builds of the hot modules, alternating "
        "(default: whichever runs here)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.builds:
        builds = [b.strip() for b in args.builds.split(",") if b.strip()]
        if not builds or any(b not in ("compiled", "pure") for b in builds):
            parser.error(f"--builds: compiled and/or pure, got {args.builds!r}")
        document = run_by_build(args, builds)
    else:
        document = run(args)
    print(markdown(document))
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
