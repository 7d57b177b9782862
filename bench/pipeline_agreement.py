"""Sim-to-live agreement for pipelines: one slice of the Alibaba LoRA pipeline workload
through the live stack (embedded: every service in this process, in-memory bus and state,
emulated-models workers) and through the multi-model simulator, call latency P50 and P99
compared in model seconds (target: within 15 %).

The workload: ``lora_workload(LORA_SAMPLE, models=4, pipeline_share=0.3, seed=0,
time_scale=S)`` (``--arrival-compression`` S: trace seconds per model second of
arrival), its first ``--limit`` calls. The live stack serves the ``alibaba-lora``
catalogue, which is built from the same sample with the same options, so its models and
pipelines must equal the workload's: checked, and the run refused naming every
difference. The default S = 250 keeps the default cluster well below saturation: the
first 200 calls offer 1.95 stage-seconds a second (replicas busy at once) against 8
replica slots on 2 workers of the default vector (each fits 4 base models: 0.5 GPU of
2), 24 %; the busiest model, M0002, 0.73 erlangs (one replica of it 73 % busy unless the
policy adds another). The bench prints these figures for any S; at the trace's own
1000 the same calls offer 7.8 of 8 slots.

The simulator runs the slice on ``--workers`` identical workers of the settings' resource
vector (16 cores, 2 GPUs, 128 GiB, speed 1 by default) under ``--policy``, configured
as the live stack runs (:func:`research.multimodel.agreement.live_sim_config`): rounds at
``placement_update_hz / T`` a model second, no routing pause, no extra rounds, the live
demand smoothing.

The live side: the embedded stack with as many emulated-models workers, time scale T
(``--time-scale``), placement rounds ``--placement-update-hz`` a wall second, heartbeats
every 0.1 s, admission off; the same calls replayed open-loop (:mod:`loadgen.replay`) at
speed-up T, each call's answer read; latencies times T are model seconds. Each call must
be answered exactly once: a 200 listing each stage of its pipeline once, ``ok``, and each
stage's request record in the ledger ``ok`` without a re-assignment or superseded run.

``--time-scale 50,25 --placement-update-hz 5,2.5`` runs the live side twice with the same
model-time dynamics (rounds a model second, load and stage times) but the control plane's
wall-clock delays counting twice as much at T = 50: what of the gap grows with T is
control-plane overhead, what does not is a difference of model or of decisions.

The adaptive policies' decisions hang on timing (when a burst's demand is seen decides
whether a hot model keeps a second replica), so the deterministic simulation is one draw:
the simulator is also run ``--band-seeds`` times with every arrival delayed by an
exponential jitter of mean ``--jitter-ms`` wall milliseconds times T (the default 4 ms is
the live route-plus-hop delay of a stage measured at T = 50, 0.2 model s), and the live
P50 and P99 are set against that range and its median.

Run ``make bench-pipeline-agreement`` or ``python -m bench.pipeline_agreement [options]``;
the table goes to stdout, the JSON to ``bench/results/pipeline_agreement/``, the services'
log lines to ``services.log`` beside it. Emulated times are a model's output, not
measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from switchyard.config import Settings
from switchyard.lifecycle import RequestLedger
from switchyard.multimodel.alibaba import lora_workload
from switchyard.multimodel.model import ResourceVector, WorkerSpec, Workload
from switchyard.multimodel.policy_registry import (
    UnknownMultiModelPolicyError,
    make_multimodel_policy,
)
from switchyard.serving.artifacts import settings_catalogue
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.serving.pipelines import ALIBABA_LORA_OPTIONS
from switchyard.stats import quantile
from switchyard.traces.alibaba import LORA_SAMPLE

from cli.stack_demo import send_logs_to_file
from loadgen.mixes import PlannedRequest, pipeline_calls
from loadgen.replay import replay
from loadgen.replay_records import OK, ReplayResult
from research.multimodel.agreement import (
    DEFAULT_TOLERANCE,
    LIVE_ONLY_PARTS,
    STAGE_PARTS,
    PipelineAgreement,
    PipelineAgreementError,
    SimBand,
    catalogue_problems,
    compare,
    live_sim_config,
    offered_load,
    sim_band,
    simulate_slice,
    workload_slice,
)
from research.multimodel.agreement_runs import RepeatedAgreement, repeated
from research.multimodel.run import MultiModelResult, MultiModelSimConfig
from services.embedded import EmbeddedPlan, EmbeddedStack, EmbeddedStartError
from services.placement.service import DEMAND_TAU_MODEL_S, PlacementService
from services.scheduler.service import SchedulerService
from services.worker.placement import placement_of
from services.worker.service import WorkerService

RESULTS = Path(__file__).parent / "results" / "pipeline_agreement"
CATALOGUE = "alibaba-lora"
HEARTBEAT_INTERVAL_S = 0.1
READY_TIMEOUT_S = 60.0


def build_workload(compression: float, limit: int) -> Workload:
    """The first ``limit`` calls of the LoRA sample's workload, arrivals compressed
    ``compression`` times; the catalogue is the ``alibaba-lora`` one's."""
    options = {**ALIBABA_LORA_OPTIONS, "time_scale": compression}
    return workload_slice(lora_workload(LORA_SAMPLE, **options), limit)


def cluster(settings: Settings, count: int) -> list[WorkerSpec]:
    """``count`` workers of the settings' resource vector, named as the embedded stack
    names its emulated-models workers."""
    capacity = ResourceVector(
        settings.worker_cpu_cores, settings.worker_gpus, settings.worker_host_mem_gib
    )
    return [
        WorkerSpec(
            worker_id=f"models-{index}",
            gpu_type=settings.worker_gpu_type,
            capacity=capacity,
            speed=settings.worker_speed,
        )
        for index in range(count)
    ]


def plan_of(workload: Workload) -> list[PlannedRequest]:
    """The workload's calls as the load generator sends them (``kind`` pipeline)."""
    return pipeline_calls(workload.requests)


def live_settings(base: Settings, *, policy: str, time_scale: float, update_hz: float) -> Settings:
    return base.model_copy(
        update={
            "pipeline_catalogue": CATALOGUE,
            "worker_time_scale": time_scale,
            "placement_policy": policy,
            "placement_update_hz": update_hz,
            "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
            "admission": "off",
            "log_level": "WARNING",
        }
    )


def checked_catalogue(settings: Settings, workload: Workload) -> ServingCatalogue:
    """The catalogue the live stack would serve; exits naming every difference from the
    workload's."""
    catalogue = settings_catalogue(settings)
    problems = catalogue_problems(
        workload.models, workload.pipelines, catalogue.models, catalogue.pipelines
    )
    if problems:
        sys.exit(
            f"the live {CATALOGUE} catalogue is not the workload's:\n  " + "\n  ".join(problems)
        )
    return catalogue


async def wait_for_model_workers(stack: EmbeddedStack, count: int) -> None:
    """Until the scheduler routes to and the placement service places on ``count``
    workers (the stack's own start waits for none of the emulated-models workers)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    scheduler, placement = stack.service("scheduler"), stack.service("placement")
    assert isinstance(scheduler, SchedulerService)
    assert isinstance(placement, PlacementService)
    while True:
        routed = len(scheduler.stages.placer.workers)
        snapshot = placement.last_snapshot
        placed = 0 if snapshot is None else len(snapshot.workers)
        if routed >= count and placed >= count:
            return
        if time.monotonic() > deadline:
            raise EmbeddedStartError(
                f"the emulated-models workers were not seen within {READY_TIMEOUT_S:g} s: "
                f"the scheduler routes to {routed}, the placement service places on {placed} "
                f"of {count}"
            )
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def model_workers_stack(
    settings: Settings, catalogue: ServingCatalogue, workers: int
) -> AsyncIterator[EmbeddedStack]:
    """A started embedded stack with ``workers`` emulated-models workers and no others,
    once the scheduler and the placement service see them all; stopped on leaving."""
    stack = EmbeddedStack(
        settings,
        EmbeddedPlan(llm_workers=(), torch_workers=0, model_workers=workers, http_port=0),
        catalogue,
    )
    await stack.start()
    try:
        await wait_for_model_workers(stack, workers)
        yield stack
    finally:
        await stack.stop()


async def _ledger_counts(stack: EmbeddedStack, result: ReplayResult) -> dict[str, int]:
    """The request records of the stages of every 200 answer: how many there are, are
    ``ok``, were re-assigned (epoch > 0), and the runs superseded (answers refused)."""
    ledger = RequestLedger(stack.state)
    counts = {"stages": 0, "ok": 0, "missing": 0, "reassigned": 0, "superseded_runs": 0}
    for record in result.records:
        if record.outcome != OK:
            continue
        for stage in record.stages or ():
            counts["stages"] += 1
            found = await ledger.read(str(stage.get("request_id", "")))
            if found is None:
                counts["missing"] += 1
                continue
            counts["ok"] += found.status == "ok"
            counts["reassigned"] += found.epoch > 0
            counts["superseded_runs"] += found.superseded_runs
    return counts


def _worker_loads(stack: EmbeddedStack) -> dict[str, int]:
    """Loads each emulated-models worker started (ordered and on demand)."""
    loads: dict[str, int] = {}
    for worker in stack.workers():
        assert isinstance(worker, WorkerService)
        placement = placement_of(worker.backend)
        if placement is not None:
            loads[worker.worker_id] = placement.loads_total
    return loads


async def run_live(
    settings: Settings, catalogue: ServingCatalogue, workload: Workload, workers: int
) -> tuple[ReplayResult, dict[str, int], dict[str, Any]]:
    """Replay ``workload`` through a fresh embedded stack; returns the replay, the ledger
    counts and the placement figures (rounds, loads, unloads, refusals)."""
    async with model_workers_stack(settings, catalogue, workers) as stack:
        result = await replay(
            plan_of(workload),
            stack.url,
            speedup=settings.worker_time_scale,
            timeout_s=settings.answer_timeout_s,
            progress=False,
        )
        ledger = await _ledger_counts(stack, result)
        placement = stack.service("placement")
        assert isinstance(placement, PlacementService)
        figures: dict[str, Any] = {
            "rounds": placement.rounds,
            "loads_ordered": placement.loads_ordered,
            "unloads_ordered": placement.unloads_ordered,
            "plans_refused": placement.plans_refused,
            "worker_loads": _worker_loads(stack),
        }
    return result, ledger, figures


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sys.exit(f"{name}: expected numbers separated by commas, got {text!r}")
    if not values or any(not v > 0 for v in values):
        sys.exit(f"{name}: every value must be > 0, got {text!r}")
    return values


def _sim_summary(config: MultiModelSimConfig, result: MultiModelResult) -> dict[str, Any]:
    return {
        "config": asdict(config),
        "updates": len(result.updates),
        "loads": sum(u.loads for u in result.updates),
        "evictions": sum(u.evictions for u in result.updates),
        "stages_run": result.stages_run,
    }


def _sim_line(scale: float, latencies: Sequence[float], band: SimBand) -> str:
    return (
        f"T {scale:g}: simulated P50 {quantile(latencies, 0.5):.1f} s, P99 "
        f"{quantile(latencies, 0.99):.1f} s; jittered by {band.jitter_s:g} s, {band.seeds} "
        f"seeds: P50 {band.p50_min_s:.1f}-{band.p50_max_s:.1f} s, P99 "
        f"{band.p99_min_s:.1f}-{band.p99_max_s:.1f} s"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline_agreement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--limit", type=int, default=200, help="calls replayed (first N)")
    parser.add_argument(
        "--arrival-compression",
        type=float,
        default=250.0,
        help="trace seconds per model second of arrival, S (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=2, help="emulated-models workers, K")
    parser.add_argument("--policy", default="adaptive-balanced")
    parser.add_argument(
        "--time-scale", default="50", help="T, the workers' speed-up; several: 50,25"
    )
    parser.add_argument(
        "--placement-update-hz",
        default="5",
        help="placement rounds a wall second, one value or one per time scale",
    )
    parser.add_argument("--seed", type=int, default=0, help="the simulator's seed")
    parser.add_argument(
        "--jitter-ms",
        type=float,
        default=4.0,
        help="mean arrival jitter of the simulator's band, wall ms (x T: model ms)",
    )
    parser.add_argument("--band-seeds", type=int, default=40, help="jittered simulations")
    parser.add_argument(
        "--runs", type=int, default=1, help="live replays per time scale (medians compared)"
    )
    parser.add_argument("--sim-only", action="store_true", help="the simulation and load alone")
    parser.add_argument("--out", type=Path, default=RESULTS / "agreement.json")
    args = parser.parse_args(argv)
    scales = _floats(args.time_scale, "--time-scale")
    rates = _floats(args.placement_update_hz, "--placement-update-hz")
    if len(rates) == 1:
        rates *= len(scales)
    if len(rates) != len(scales):
        sys.exit("--placement-update-hz: give one value, or one per --time-scale")
    if args.runs < 1:
        sys.exit(f"--runs must be at least 1, got {args.runs}")
    scales = [scale for scale in scales for _ in range(args.runs)]
    rates = [rate for rate in rates for _ in range(args.runs)]
    if args.workers < 1:
        sys.exit(f"--workers must be at least 1, got {args.workers}")
    if args.band_seeds < 1 or not args.jitter_ms > 0:
        sys.exit("--band-seeds must be at least 1 and --jitter-ms > 0")
    if not args.arrival_compression > 0:
        sys.exit(f"--arrival-compression must be > 0, got {args.arrival_compression}")
    try:
        make_multimodel_policy(args.policy)
        workload = build_workload(args.arrival_compression, args.limit)
    except (UnknownMultiModelPolicyError, PipelineAgreementError, ValueError) as exc:
        sys.exit(str(exc))

    base = Settings()
    workers = cluster(base, args.workers)
    load = offered_load(workload, workers)
    print(
        f"{len(workload.requests)} calls over {load.span_s:.0f} model s (S = "
        f"{args.arrival_compression:g}); offered {load.busy_replicas:.2f} busy replicas of "
        f"{load.replica_slots} slots ({load.slot_load:.0%}), dominant share "
        f"{load.share_load:.0%} of {args.workers} workers; busiest model "
        f"{load.busiest_model} {load.busiest_erlangs:.2f} erlangs",
        flush=True,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_file = args.out.parent / "services.log"
    if not args.sim_only:
        send_logs_to_file(base.model_copy(update={"log_level": "WARNING"}), log_file)
    runs: list[dict[str, Any]] = []
    rows: list[PipelineAgreement] = []
    for scale, rate in zip(scales, rates, strict=True):
        settings = live_settings(base, policy=args.policy, time_scale=scale, update_hz=rate)
        catalogue = checked_catalogue(settings, workload)
        config = live_sim_config(
            update_hz=rate, time_scale=scale, demand_tau_model_s=DEMAND_TAU_MODEL_S, seed=args.seed
        )
        started = time.perf_counter()
        sim_result, simulated = simulate_slice(workload, workers, policy=args.policy, config=config)
        band = sim_band(
            workload,
            workers,
            policy=args.policy,
            config=config,
            jitter_s=args.jitter_ms / 1000 * scale,
            seeds=args.band_seeds,
        )
        run: dict[str, Any] = {
            "time_scale": scale,
            "placement_update_hz": rate,
            "simulation": {
                **_sim_summary(config, sim_result),
                "band": asdict(band),
                "wall_s": time.perf_counter() - started,
            },
        }
        if args.sim_only:
            print(_sim_line(scale, [c.latency_s for c in simulated], band), flush=True)
            runs.append(run)
            continue
        print(f"T {scale:g}, {rate:g} rounds/s: replaying ...", flush=True)
        started = time.perf_counter()
        try:
            result, ledger, figures = asyncio.run(
                run_live(settings, catalogue, workload, args.workers)
            )
        except EmbeddedStartError as exc:
            sys.exit(f"T {scale:g}: {exc} (service logs: {log_file})")
        try:
            agreement = compare(
                result.records,
                simulated,
                workload,
                policy=args.policy,
                time_scale=scale,
                update_hz=rate,
                workers=args.workers,
            )
        except PipelineAgreementError as exc:
            sys.exit(f"T {scale:g}: {exc} (service logs: {log_file})")
        agreement = replace(agreement, ledger=ledger, band=band)
        rows.append(agreement)
        run.update(
            agreement=agreement.to_json(),
            live={
                **figures,
                "wall_s": time.perf_counter() - started,
                "replay": result.config(),
                "replay_cpu_s": result.cpu_s,
            },
        )
        runs.append(run)
        simulation = run["simulation"]
        print(
            f"T {scale:g}: P50 x{agreement.p50_ratio:.3f}, P99 x{agreement.p99_ratio:.3f} "
            f"({'within' if agreement.within() else 'outside'} {DEFAULT_TOLERANCE:.0%}); "
            f"placement: sim {simulation['loads']} loads, {simulation['evictions']} evictions "
            f"in {simulation['updates']} rounds; live {figures['loads_ordered']} loads, "
            f"{figures['unloads_ordered']} unloads ordered in {figures['rounds']} rounds, "
            f"{figures['plans_refused']} plans refused",
            flush=True,
        )
    document = {
        "workload": {
            "sample": str(LORA_SAMPLE.name),
            "options": {**ALIBABA_LORA_OPTIONS, "time_scale": args.arrival_compression},
            "limit": len(workload.requests),
        },
        "workers": [asdict(w) for w in workers],
        "policy": args.policy,
        "offered_load": {**asdict(load), "slot_load": load.slot_load},
        "runs": runs,
    }
    if rows:
        print()
        print(
            f"first {len(workload.requests)} calls of the LoRA sample, S = "
            f"{args.arrival_compression:g}; {args.workers} workers; {args.policy}; model seconds"
        )
        print(format_table(rows))
        summaries = repeated(rows)
        document["repeated"] = [
            {**asdict(r), "p50_ratio": r.p50_ratio, "p99_ratio": r.p99_ratio, "within": r.within()}
            for r in summaries
        ]
        if any(r.runs > 1 for r in summaries):
            print()
            print(format_repeated(summaries))
    args.out.write_text(json.dumps(document, indent=2))
    print(f"\nwritten {args.out}" + ("" if args.sim_only else f"; service logs {log_file}"))


def format_repeated(
    summaries: Sequence[RepeatedAgreement], tolerance: float = DEFAULT_TOLERANCE
) -> str:
    """The live runs' medians against the jittered simulations' (markdown)."""
    lines = [
        "Live runs against the simulator under jitter, medians (model seconds):",
        "",
        "| T | rounds/s | live runs | live P50 | sim P50 | ratio | live P99 | sim P99 | ratio "
        "| verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in summaries:
        verdict = f"{'within' if r.within(tolerance) else 'outside'} {tolerance:.0%}"
        lines.append(
            f"| {r.time_scale:g} | {r.update_hz:g} | {r.runs} | {_s(r.live_p50_median_s)} s "
            f"| {_s(r.band.p50_median_s)} s | {r.p50_ratio:.3f} | {_s(r.live_p99_median_s)} s "
            f"| {_s(r.band.p99_median_s)} s | {r.p99_ratio:.3f} | {verdict} |"
        )
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.1f}"


def _part(summary: Mapping[str, float], key: str) -> str:
    return _s(summary.get(key)) if summary.get("count") else "-"


def format_table(rows: Sequence[PipelineAgreement], tolerance: float = DEFAULT_TOLERANCE) -> str:
    """The agreement table (markdown): latencies and verdicts, answers, then the parts."""
    lines = [
        "| policy | T | rounds/s | calls compared | sim P50 | live P50 | ratio | sim P99 "
        "| live P99 | ratio | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for a in rows:
        verdict = f"{'within' if a.within(tolerance) else 'outside'} {tolerance:.0%}"
        lines.append(
            f"| {a.policy} | {a.time_scale:g} | {a.update_hz:g} | {a.compared}/{a.planned} "
            f"| {_s(a.sim_p50_s)} s | {_s(a.live_p50_s)} s | {a.p50_ratio:.3f} "
            f"| {_s(a.sim_p99_s)} s | {_s(a.live_p99_s)} s | {a.p99_ratio:.3f} | {verdict} |"
        )
    banded = [a for a in rows if a.band is not None]
    if banded:
        lines += [
            "",
            "The simulator under arrival jitter (each arrival delayed by Exp(mean jitter), one "
            "run a seed): its P50 and P99 range, min / median / max, and live over the median:",
            "",
            "| T | jitter | seeds | sim P50 | live P50 | ratio | sim P99 | live P99 | ratio "
            "| live inside the range |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
    for a in banded:
        band = a.band
        ratios = a.band_ratios()
        assert band is not None
        assert ratios is not None
        lines.append(
            f"| {a.time_scale:g} | {band.jitter_s:g} s | {band.seeds} "
            f"| {_s(band.p50_min_s)} / {_s(band.p50_median_s)} / {_s(band.p50_max_s)} s "
            f"| {_s(a.live_p50_s)} s | {ratios[0]:.3f} "
            f"| {_s(band.p99_min_s)} / {_s(band.p99_median_s)} / {_s(band.p99_max_s)} s "
            f"| {_s(a.live_p99_s)} s | {ratios[1]:.3f} | {'yes' if a.inside_band() else 'no'} |"
        )
    lines += [
        "",
        "| T | 200 answers | complete, each stage once | not 200 | stage records ok "
        "| re-assigned | superseded runs | sim unfinished | max send lag |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for a in rows:
        not_ok = ", ".join(f"{k} {v}" for k, v in a.not_ok.items()) or "none"
        lines.append(
            f"| {a.time_scale:g} | {a.answered_ok}/{a.planned} | {a.complete_answers} | {not_ok} "
            f"| {a.ledger.get('ok', '-')}/{a.ledger.get('stages', '-')} "
            f"| {a.ledger.get('reassigned', '-')} | {a.ledger.get('superseded_runs', '-')} "
            f"| {a.sim_unfinished} | {_s(a.max_send_lag_s)} s |"
        )
    lines += [
        "",
        "Per stage, model seconds, P50 / P99 (sim: held = ready to routed, queue = routed to "
        "start; live: route = arrival to assigned, dispatch = assigned to start; wait = ready "
        "to start, gap = live minus sim for the same stage):",
        "",
        "| T | held sim | queue sim | route live | dispatch live | wait sim | wait live "
        "| wait gap | hop live | exec excess live | answer (HTTP) live | paired call gap P50 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in rows:
        cells = [
            f"{_part(a.parts[name], 'p50')} / {_part(a.parts[name], 'p99')}"
            for name in (*STAGE_PARTS, *LIVE_ONLY_PARTS)
        ]
        lines.append(
            f"| {a.time_scale:g} | " + " | ".join(cells) + f" | {_s(a.paired_gap_p50_s)} s |"
        )
    lines += [
        "",
        "| T | stages per worker sim | live |",
        "|---:|---|---|",
    ]
    for a in rows:
        lines.append(
            f"| {a.time_scale:g} | {_spread(a.sim_stages_by_worker)} "
            f"| {_spread(a.live_stages_by_worker)} |"
        )
    return "\n".join(lines)


def _spread(by_worker: Mapping[str, int]) -> str:
    return ", ".join(f"{worker} {count}" for worker, count in by_worker.items()) or "-"


if __name__ == "__main__":
    main()
