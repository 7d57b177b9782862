"""Pipelines with LLM stages, measured: a draft checked by a larger model (the
``assistant`` catalogue's ``draft-verify``) against the larger model answering alone.

The stack: the embedded one (every service in this process, in-memory bus and state)
with one emulated ``llama-2-7b`` and one emulated ``llama-2-13b`` worker, both on A100
profiles, at time scale ``--time-scale``. For each load of ``--loads`` (calls a model
second), one Poisson stream of ``--duration`` model seconds (seed ``--seed``) is offered
once per mode of ``--modes``, each time to a fresh stack, open-loop: as ``draft-verify``
calls (a 128-token draft by the 7b model, a one-token verdict by the 13b model over the
input and the draft, and a 128-token answer by the 13b model only when it rejects the
draft; the emulated verifier accepts 70 % of drafts, an assumption) and as
``llama-2-13b`` completions of 128 tokens. Every call has the same input of about
``--input-tokens`` tokens. Reported per load and mode: calls offered, answered and
refused, the answered calls within their objective (the pipeline's or the application's
``slo_s``: 30 and 60 model seconds) as a share of those offered, latency P50 and P99 of
the answered calls in model seconds (client wall time times the time scale), the share
of drafts accepted, and the tokens the 13b model generated a call.

A third mode, ``triage``, sends the calls to the ``triage`` pipeline: an intent
classifier on an emulated-models worker (placed by the placement service) sends 40 % of
them to the 13b model and the rest to the 7b one, 128 tokens each.

With ``--simulate`` every load and mode also runs through the multi-model simulator
(:mod:`research.multimodel.llm_stages`: the same arrivals, input, profiles and policies,
one simulated worker per model; ``triage``'s node and placement rounds as the live
stack's; each call under its live request id, so that its verdict or label is the one
the live emulated worker draws for it, ``MultiModelSimConfig.labels_from_ids``), and the
table gives the simulated P50 and P99 beside the live ones and the gap between them.
``--sim-only`` runs the simulations alone (seconds).

Run ``python -m bench.llm_pipeline_bench [options]``; the table goes to stdout, the JSON
to ``bench/results/llm_pipeline/``. LLM times are a performance model's (emulated), not
measurements; the control plane's delays are real.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from switchyard.config import Settings, load_settings
from switchyard.contracts.fields import WorkloadType
from switchyard.multimodel.model import (
    LlmStage,
    MultiModelRequest,
    PipelineSpec,
    Stage,
    Workload,
)
from switchyard.multimodel.policy_registry import make_multimodel_policy
from switchyard.serving.pipelines import pipeline_catalogue
from switchyard.stats import quantile

from bench.pipeline_agreement import cluster, wait_for_model_workers
from cli.stack_demo import send_logs_to_file
from research.multimodel.agreement import live_sim_config
from research.multimodel.llm_stages import LlmWorkers
from research.multimodel.simulator import simulate_multimodel
from services.embedded import EmbeddedPlan, EmbeddedStack
from services.ingress.tokens import approximate_tokens
from services.placement.service import DEMAND_TAU_MODEL_S

RESULTS = Path(__file__).parent / "results" / "llm_pipeline"
WORKERS = ("a100-80gb/llama-2-7b", "a100-80gb/llama-2-13b")
MODES = ("draft-verify", "llama-2-13b", "triage")
PIPELINE_MODES = ("draft-verify", "triage")
WARM_MODEL_S = 10.0
"""Where the simulated calls of ``triage`` start: after a first call (not counted) had its
classifier placed and answered, as the live run's warm-up call does."""
ANSWER_TOKENS = 128


@dataclass(frozen=True, slots=True)
class ModeResult:
    load: float
    mode: str
    offered: int
    answered: int
    refused: int
    other: int
    other_outcomes: dict[str, int]
    """The calls neither answered nor refused, by status and error (0: no HTTP answer)."""
    within_slo: int
    """Answered within the objective of the call's pipeline or application."""
    p50_model_s: float | None
    p99_model_s: float | None
    accepted_share: float | None
    large_tokens_per_call: float
    sim_p50_model_s: float | None = None
    sim_p99_model_s: float | None = None


@dataclass(frozen=True, slots=True)
class _Call:
    status: int
    latency_s: float
    body: dict[str, Any]


def arrivals(rate_per_model_s: float, duration_model_s: float, seed: int) -> list[float]:
    rng = random.Random(f"llm-pipeline:{seed}")
    times, t_s = [], rng.expovariate(rate_per_model_s)
    while t_s < duration_model_s:
        times.append(t_s)
        t_s += rng.expovariate(rate_per_model_s)
    return times


async def _one(client: httpx.AsyncClient, mode: str, text: str, request_id: str) -> _Call:
    body: dict[str, Any]
    if mode in PIPELINE_MODES:
        path, body = f"/v1/apps/{mode}/infer", {"input": text, "request_id": request_id}
    else:
        path = "/v1/completions"
        body = {"model": mode, "prompt": text, "max_tokens": ANSWER_TOKENS}
    started = time.monotonic()
    try:
        answer = await client.post(path, json=body)
    except httpx.HTTPError as exc:  # counted among "other", not fatal to the run
        return _Call(0, time.monotonic() - started, {"error": repr(exc)})
    return _Call(answer.status_code, time.monotonic() - started, answer.json())


def stack_settings(time_scale: float) -> Settings:
    return load_settings(
        {},
        worker_time_scale=time_scale,
        pipeline_catalogue="assistant",
        log_level="WARNING",
        heartbeat_interval_s=0.1,
    )


async def run_mode(
    mode: str, times_s: Sequence[float], *, time_scale: float, text: str, run: str
) -> tuple[list[_Call], float]:
    """The calls of one mode, and their objective in model seconds."""
    settings = stack_settings(time_scale)
    model_workers = 1 if mode == "triage" else 0  # the classifier's emulated-models node
    plan = EmbeddedPlan(
        llm_workers=WORKERS, torch_workers=0, model_workers=model_workers, http_port=0
    )
    stack = EmbeddedStack(settings, plan)
    await stack.start()
    catalogue = stack.catalogue
    assert catalogue is not None
    if mode in PIPELINE_MODES:
        slo_model_s = catalogue.pipelines[mode].slo_s
    else:
        slo_model_s = catalogue.llm[mode].slo_s
    try:
        if model_workers:
            await wait_for_model_workers(stack, model_workers)
        # Open loop: every call gets its own connection at once. (httpx's default pool of
        # 100 would queue the rest in this client, where neither the stack nor its
        # admission control can see them.)
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
        async with httpx.AsyncClient(base_url=stack.url, timeout=300.0, limits=limits) as client:
            await _one(client, mode, text, f"{run}-warm")  # not counted
            start = time.monotonic()
            tasks = []
            for index, at_s in enumerate(times_s):
                delay = start + at_s / time_scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(_one(client, mode, text, f"{run}-{index}")))
            return list(await asyncio.gather(*tasks)), slo_model_s
    finally:
        await stack.stop()


def simulate_mode(
    mode: str,
    times_s: Sequence[float],
    input_tokens: int,
    *,
    run: str,
    seed: int = 0,
    time_scale: float = 2.0,
) -> list[float]:
    """The calls' latencies (model seconds) in the multi-model simulator, sorted: the live
    run's LLM workers, LLM policy and (``triage``) its emulated-models node, placement
    policy and rounds (:func:`~research.multimodel.agreement.live_sim_config`)."""
    settings = stack_settings(time_scale)
    models, pipelines = pipeline_catalogue("assistant")
    if mode in PIPELINE_MODES:
        pipeline = pipelines[mode]
    else:  # the larger model alone: one LLM stage of the same answer length
        stage = Stage(name="answer", model=mode, llm=LlmStage(output_tokens=ANSWER_TOKENS))
        pipeline = PipelineSpec(name=mode, stages=(stage,), slo_s=60.0)
    start_s = WARM_MODEL_S if mode == "triage" else 0.0
    arrivals_s = [start_s + at_s - times_s[0] for at_s in times_s]
    # The live run's request ids (run_mode), so each call takes the live call's branch.
    ids = [f"{run}-{i}" for i in range(len(times_s))]
    if mode == "triage":
        arrivals_s.insert(0, 0.0)  # the warm-up call, left out below
        ids.insert(0, f"{run}-warm")
    requests = tuple(
        MultiModelRequest(rid, at_s, pipeline.name, input_tokens=input_tokens)
        for rid, at_s in zip(ids, arrivals_s, strict=True)
    )
    workload = Workload(
        name=mode, models=models, pipelines={pipeline.name: pipeline}, requests=requests
    )
    policy = make_multimodel_policy(settings.placement_policy)
    config = live_sim_config(
        update_hz=settings.placement_update_hz,
        time_scale=time_scale,
        demand_tau_model_s=DEMAND_TAU_MODEL_S,
        seed=seed,
    )
    llm_workers = [
        LlmWorkers(worker.split("/")[1], (worker,), WorkloadType.CONVERSATION) for worker in WORKERS
    ]
    result = simulate_multimodel(
        workload,
        cluster(settings, 1) if mode == "triage" else (),
        policy.placement,
        policy.router,
        replace(config, llm_policy=settings.llm_policy, labels_from_ids=True),
        llm_workers,
    )
    latencies = list(result.latencies_s)
    return sorted(latencies[1:] if mode == "triage" else latencies)


def summarise(
    load: float, mode: str, calls: Sequence[_Call], time_scale: float, slo_model_s: float
) -> ModeResult:
    ok = [c for c in calls if c.status == 200]
    latencies = sorted(c.latency_s * time_scale for c in ok)
    verdicts: list[str] = []
    large_tokens = 0
    for call in ok:
        if mode not in PIPELINE_MODES:
            large_tokens += call.body["usage"]["completion_tokens"]
            continue
        stages = {s["stage"]: s for s in call.body["stages"]}
        if mode == "triage":  # the classifier sent it to the 13b model or the 7b one
            large_tokens += ANSWER_TOKENS if "code" in stages else 0
            continue
        verdicts.append(stages["verify"]["label"])
        large_tokens += 1 + (ANSWER_TOKENS if "revise" in stages else 0)
    refused = sum(c.status in (429, 503) for c in calls)
    return ModeResult(
        load=load,
        mode=mode,
        offered=len(calls),
        answered=len(ok),
        refused=refused,
        other=len(calls) - len(ok) - refused,
        other_outcomes=dict(
            Counter(
                f"{c.status}: {str(c.body.get('error', ''))[:120]}"
                for c in calls
                if c.status not in (200, 429, 503)
            )
        ),
        within_slo=sum(latency <= slo_model_s for latency in latencies),
        p50_model_s=quantile(latencies, 0.5) if latencies else None,
        p99_model_s=quantile(latencies, 0.99) if latencies else None,
        accepted_share=verdicts.count("accept") / len(verdicts) if verdicts else None,
        large_tokens_per_call=large_tokens / len(ok) if ok else 0.0,
    )


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _gap(live: float | None, sim: float | None) -> str:
    if live is None or sim is None or live <= 0:
        return "-"
    return f"{100 * (sim - live) / live:+.0f} %"


def table(rows: Sequence[ModeResult]) -> str:
    simulated = any(r.sim_p50_model_s is not None for r in rows)
    head = (
        "| load (calls/model s) | mode | offered | answered | refused | within SLO | P50 s | "
        "P99 s | drafts accepted | 13b tokens a call |"
    )
    rule = "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    if simulated:
        head += " sim P50 s (gap) | sim P99 s (gap) |"
        rule += "---:|---:|"
    lines = [head, rule]
    for r in rows:
        share = "-" if r.accepted_share is None else f"{100 * r.accepted_share:.0f} %"
        line = (
            f"| {r.load:g} | {r.mode} | {r.offered} | {r.answered} | {r.refused} | "
            f"{r.within_slo} ({100 * r.within_slo / max(1, r.offered):.0f} %) | "
            f"{_s(r.p50_model_s)} | {_s(r.p99_model_s)} | {share} | "
            f"{r.large_tokens_per_call:.1f} |"
        )
        if simulated:
            line += (
                f" {_s(r.sim_p50_model_s)} ({_gap(r.p50_model_s, r.sim_p50_model_s)}) |"
                f" {_s(r.sim_p99_model_s)} ({_gap(r.p99_model_s, r.sim_p99_model_s)}) |"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--loads", default="1,4,8,12,16", help="calls a model second, comma-separated"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="model seconds")
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--input-tokens", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument(
        "--simulate", action="store_true", help="also run each load in the simulator"
    )
    parser.add_argument(
        "--sim-only", action="store_true", help="run the simulator alone (no live stack)"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose among {', '.join(MODES)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    send_logs_to_file(load_settings({}, log_level="WARNING"), RESULTS / "services.log")
    text = ("Review this function and say what it returns. " * 100)[: 4 * args.input_tokens]
    rows = []
    for load in (float(x) for x in args.loads.split(",")):
        times_s = arrivals(load, args.duration, args.seed)
        for mode in modes:
            if args.sim_only:
                row = ModeResult(
                    load=load, mode=mode, offered=len(times_s), answered=0, refused=0,
                    other=0, other_outcomes={}, within_slo=0, p50_model_s=None,
                    p99_model_s=None, accepted_share=None, large_tokens_per_call=0.0,
                )  # fmt: skip
            else:
                calls, slo_model_s = asyncio.run(
                    run_mode(mode, times_s, time_scale=args.time_scale, text=text, run=f"{load:g}")
                )
                row = summarise(load, mode, calls, args.time_scale, slo_model_s)
            if args.simulate or args.sim_only:
                simulated = simulate_mode(
                    mode,
                    times_s,
                    approximate_tokens(text),
                    run=f"{load:g}",
                    seed=args.seed,
                    time_scale=args.time_scale,
                )
                row = replace(
                    row,
                    sim_p50_model_s=quantile(simulated, 0.5),
                    sim_p99_model_s=quantile(simulated, 0.99),
                )
            rows.append(row)
            if row.other_outcomes:
                print(f"  neither answered nor refused: {row.other_outcomes}", flush=True)
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    document = {"config": vars(args), "rows": [asdict(r) for r in rows]}
    (RESULTS / "llm_pipeline.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
