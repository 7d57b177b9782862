"""Admission control for pipeline calls, measured: goodput and latency of one pipeline's
calls offered at multiples of the cluster's capacity, with the pipeline gate on
(``SWITCHYARD_ADMISSION=deadline``) and off, in one run.

The stack: the embedded one (every service in this process, in-memory bus and state)
with ``--workers`` emulated-models workers of the default resource vector serving the
``txt2img`` catalogue at time scale ``--time-scale``. Each placed model is one replica
serving one stage at a time, so a pipeline's capacity is set by its slowest stage:
``workers / max(exec_s)`` calls a model second (``txt2img-hd``: the upscaler's 3 s, 0.67
calls a model second on 2 workers) when the placement service puts every model on every
worker, which it does for a steady stream of one pipeline.

Each run: a fresh stack, four calls one after another to let the placement service
place the models (not counted), then a Poisson stream of ``--duration`` model seconds at
``load x capacity`` (seed ``--seed``, the same arrivals for both modes), replayed
open-loop; a call's latency is read in model seconds (wall times ``time_scale``).
Reported per load and mode: calls offered, answered, refused (429 or 503), answered
within the pipeline's SLO, goodput (calls within the SLO per model second of offered
stream), the latency P50 and P99 of the answered calls, and the stages they ran (fewer
than their pipeline's where a conditional stage's branch was not taken:
``txt2img-checked`` upscales only what its checker labels ``safe``). ``--slack`` sets
``SWITCHYARD_ADMISSION_SLACK`` of the runs with the gate (default 1.0).

Run ``make bench-pipeline-admission`` or ``python -m bench.pipeline_admission [options]``;
the table goes to stdout, the JSON to ``bench/results/pipeline_admission/``, the
services' log lines to ``services.log`` beside it. Stage times are a performance
model's (emulated), not measurements; the control plane's delays are real.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from switchyard.config import Settings
from switchyard.serving.artifacts import settings_catalogue
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.stats import quantile

from bench.pipeline_agreement import model_workers_stack
from cli.stack_demo import send_logs_to_file
from loadgen.mixes import PlannedRequest
from loadgen.replay import replay
from loadgen.replay_records import OK, REJECTED, ReplayResult

RESULTS = Path(__file__).parent / "results" / "pipeline_admission"
WARM_UP_CALLS = 4


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One load in one mode."""

    load: float
    admission: str
    offered: int
    answered: int
    refused: int
    within_slo: int
    other: int
    goodput_per_model_s: float
    p50_model_s: float | None
    p99_model_s: float | None
    stages_run: int
    """Stages the answered calls ran (a conditional stage whose branch was not taken is
    skipped, and not counted)."""


def capacity_per_model_s(catalogue: ServingCatalogue, pipeline: str, workers: int) -> float:
    """Calls a model second the cluster can serve: one replica of each model per worker,
    the slowest stage the bottleneck."""
    spec = catalogue.pipelines[pipeline]
    slowest_s = max(catalogue.models[stage.model].exec_s for stage in spec.stages)
    return workers / slowest_s


def poisson_plan(
    pipeline: str, rate_per_model_s: float, duration_model_s: float, seed: int
) -> list[PlannedRequest]:
    """Calls of ``pipeline`` at Poisson arrivals (model seconds)."""
    rng = random.Random(f"pipeline-admission:{seed}")
    arrivals: list[float] = []
    t_s = rng.expovariate(rate_per_model_s)
    while t_s < duration_model_s:
        arrivals.append(t_s)
        t_s += rng.expovariate(rate_per_model_s)
    return [
        PlannedRequest(
            index=index,
            arrival_s=arrival_s,
            kind="pipeline",
            app=pipeline,
            workload="pipeline",
            exec_scale=1.0,
        )
        for index, arrival_s in enumerate(arrivals)
    ]


def stack_settings(
    base: Settings, *, admission: str, time_scale: float, slack: float = 1.0
) -> Settings:
    return base.model_copy(
        update={
            "admission_slack": slack,
            "pipeline_catalogue": "txt2img",
            "worker_time_scale": time_scale,
            "heartbeat_interval_s": 0.1,
            "admission": admission,
            "log_level": "WARNING",
        }
    )


def summarise(
    result: ReplayResult, *, load: float, admission: str, time_scale: float, duration_s: float
) -> ModeResult:
    records = result.records
    answered = [r for r in records if r.outcome == OK]
    latencies = sorted(r.latency_s * time_scale for r in answered if r.latency_s is not None)
    within = sum(r.deadline_met is True for r in answered)
    refused = sum(r.outcome == REJECTED for r in records)
    return ModeResult(
        load=load,
        admission=admission,
        offered=len(records),
        answered=len(answered),
        refused=refused,
        within_slo=within,
        other=len(records) - len(answered) - refused,
        goodput_per_model_s=within / duration_s,
        p50_model_s=quantile(latencies, 0.5) if latencies else None,
        p99_model_s=quantile(latencies, 0.99) if latencies else None,
        stages_run=sum(len(r.stages or ()) for r in answered),
    )


async def run_mode(
    settings: Settings,
    catalogue: ServingCatalogue,
    plan: list[PlannedRequest],
    *,
    workers: int,
    pipeline: str,
) -> ReplayResult:
    """``plan`` through a fresh embedded stack, after the warm-up calls."""
    async with model_workers_stack(settings, catalogue, workers) as stack:
        warm_up = [
            PlannedRequest(
                index=i, arrival_s=0.0, kind="pipeline", app=pipeline, workload="pipeline"
            )
            for i in range(WARM_UP_CALLS)
        ]
        for call in warm_up:
            await replay([call], stack.url, speedup=1.0, timeout_s=60.0, progress=False)
        return await replay(
            plan,
            stack.url,
            speedup=settings.worker_time_scale,
            timeout_s=settings.answer_timeout_s,
            progress=False,
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(rows: Sequence[ModeResult], slo_s: float) -> str:
    lines = [
        f"{'load':>5} {'admission':>9} {'offered':>7} {'answered':>8} {'refused':>7} "
        f"{'in SLO':>6} {'other':>5} {'goodput/s':>9} {'P50 s':>6} {'P99 s':>6} "
        f"{'stages':>6}",
    ]
    for row in rows:
        lines.append(
            f"{row.load:>5g} {row.admission:>9} {row.offered:>7} {row.answered:>8} "
            f"{row.refused:>7} {row.within_slo:>6} {row.other:>5} "
            f"{row.goodput_per_model_s:>9.3f} {_ms(row.p50_model_s):>6} "
            f"{_ms(row.p99_model_s):>6} {row.stages_run:>6}"
        )
    lines.append(f"(SLO {slo_s:g} model s; latencies and goodput in model seconds)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="txt2img-hd")
    parser.add_argument("--loads", default="0.5,1,2,4", help="multiples of capacity")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--duration", type=float, default=150.0, help="model seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--slack", type=float, default=1.0, help="SWITCHYARD_ADMISSION_SLACK of the gated runs"
    )
    args = parser.parse_args(argv)
    loads = [float(part) for part in args.loads.split(",") if part.strip()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = Settings()
    send_logs_to_file(base.model_copy(update={"log_level": "WARNING"}), RESULTS / "services.log")
    catalogue = settings_catalogue(stack_settings(base, admission="off", time_scale=1.0))
    if args.pipeline not in catalogue.pipelines:
        raise SystemExit(
            f"unknown pipeline {args.pipeline!r}; the txt2img catalogue has "
            f"{', '.join(sorted(catalogue.pipelines))}"
        )
    capacity = capacity_per_model_s(catalogue, args.pipeline, args.workers)
    slo_s = catalogue.pipelines[args.pipeline].slo_s
    print(
        f"{args.pipeline} on {args.workers} emulated-models workers: capacity "
        f"{capacity:.3f} calls a model second, SLO {slo_s:g} model s, time scale "
        f"{args.time_scale:g}, {args.duration:g} model s a run, admission slack {args.slack:g}",
        flush=True,
    )
    rows: list[ModeResult] = []
    started = time.monotonic()
    for load in loads:
        plan = poisson_plan(args.pipeline, load * capacity, args.duration, args.seed)
        for admission in ("off", "deadline"):
            settings = stack_settings(
                base, admission=admission, time_scale=args.time_scale, slack=args.slack
            )
            result = asyncio.run(
                run_mode(settings, catalogue, plan, workers=args.workers, pipeline=args.pipeline)
            )
            row = summarise(
                result,
                load=load,
                admission=admission,
                time_scale=args.time_scale,
                duration_s=args.duration,
            )
            rows.append(row)
            print(format_table([row], slo_s).splitlines()[1], flush=True)
    print()
    print(format_table(rows, slo_s))
    document = {
        "pipeline": args.pipeline,
        "workers": args.workers,
        "time_scale": args.time_scale,
        "duration_model_s": args.duration,
        "seed": args.seed,
        "slack": args.slack,
        "capacity_per_model_s": capacity,
        "slo_model_s": slo_s,
        "wall_s": time.monotonic() - started,
        "rows": [asdict(row) for row in rows],
    }
    out = RESULTS / f"{args.pipeline}-{int(time.time())}.json"
    out.write_text(json.dumps(document, indent=2))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
