"""One trace slice through the live stack (services as processes) and the simulator.

What the agreement test asserts and ``bench/agreement_bench.py`` records: the stack runs
on the real Kafka broker and Redis, each service a process of its own, with one emulated
worker per profile (started in the order given, as the simulator numbers its workers),
the scheduler running ``policy`` and the workers' time scale equal to the replay's
speed-up; with a chunked-prefill budget, the workers and the simulator both prefill in
chunks of it; with ``prefill_workers``, the first that many workers only prefill and
the others only decode (``SWITCHYARD_WORKER_ROLE``; the simulator's option of the same
name, its decode workers chosen on arrival as the live placer chooses them). The
simulated policy decides on heartbeats, as the live placer does, at the stack's interval
in trace seconds (``SimulationConfig.heartbeat_s``: the interval times the speed-up).
Admission control is off: the simulator has none, and a refusal would take a request
out of one side of the comparison only.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from switchyard.contracts.messages import WorkloadType
from switchyard.perf import performance_model
from switchyard.traces import resolve_trace
from switchyard.traces.transform import head

from loadgen.harness.process_stack import DEFAULT_HEARTBEAT_INTERVAL_S, ProcessStack
from loadgen.mixes import build_plan
from loadgen.replay import replay
from loadgen.replay_records import ReplayResult
from research.llm.agreement import Agreement, compare, simulate


async def run_live(
    stack: ProcessStack,
    trace: str,
    limit: int,
    *,
    speedup: float,
    profiles: Sequence[str],
    timeout_s: float = 300.0,
    prefill_workers: int | None = None,
) -> ReplayResult:
    """Start ``stack``'s services (one worker per profile, the first ``prefill_workers``
    prefilling for the others) and replay the first ``limit`` rows of ``trace`` at
    ``speedup`` through its ingress."""
    stack.start_service("monitor")
    stack.start_service("predictor")
    stack.start_service("scheduler")
    # The policy's rebalancer (GAPS has one), as the simulator runs it; idle for JSQ.
    stack.start_service("rebalancer")
    for number, profile in enumerate(profiles):
        role = (
            "mixed" if not prefill_workers else "prefill" if number < prefill_workers else "decode"
        )
        stack.start_worker(f"w{number:02d}", profile, env={"SWITCHYARD_WORKER_ROLE": role})
    stack.start_service("ingress")
    await stack.wait_ready(workers=len(profiles))
    # The simulated cluster serves one model; every workload of the slice goes to it.
    model = performance_model(profiles[0]).model
    plan = build_plan(
        resolve_trace(trace), "llm", limit, 0, app_map=dict.fromkeys(WorkloadType, model)
    )
    return await replay(plan, stack.url, speedup=speedup, timeout_s=timeout_s, progress=False)


def sim_heartbeat_s(speedup: float) -> float:
    """How often the simulated side hears from each worker, in trace seconds: the live
    placer hears every ``DEFAULT_HEARTBEAT_INTERVAL_S`` of the stack's wall time, which
    is ``speedup`` times that in trace seconds."""
    return DEFAULT_HEARTBEAT_INTERVAL_S * speedup


def agreement_stack(
    prefix: str,
    log_dir: Path,
    *,
    policy: str,
    speedup: float,
    kafka: str,
    redis: str,
    chunked_prefill_tokens: int | None = None,
) -> ProcessStack:
    """The stack :func:`run_live` runs on: the policy under test, no admission control,
    emulated time ``speedup`` times faster than modelled, chunked prefill at
    ``chunked_prefill_tokens`` when given."""
    env = {"SWITCHYARD_ADMISSION": "off"}
    if chunked_prefill_tokens is not None:
        env["SWITCHYARD_WORKER_CHUNKED_PREFILL_TOKENS"] = str(chunked_prefill_tokens)
    return ProcessStack(
        kafka, redis, prefix, log_dir, time_scale=speedup, llm_policy=policy, extra_env=env
    )


async def measure(
    trace: str,
    limit: int,
    *,
    policy: str,
    speedup: float,
    profiles: Sequence[str],
    log_dir: Path,
    kafka: str | None = None,
    redis: str | None = None,
    chunked_prefill_tokens: int | None = None,
    prefill_workers: int | None = None,
) -> tuple[Agreement, ReplayResult]:
    """The live run and the simulation of one slice, compared."""
    stack = agreement_stack(
        f"agree-{uuid.uuid4().hex[:8]}",
        log_dir,
        policy=policy,
        speedup=speedup,
        kafka=kafka or os.environ.get("SWITCHYARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        redis=redis or os.environ.get("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/0"),
        chunked_prefill_tokens=chunked_prefill_tokens,
    )
    try:
        result = await run_live(
            stack,
            trace,
            limit,
            speedup=speedup,
            profiles=profiles,
            prefill_workers=prefill_workers,
        )
    finally:
        await stack.close()
    rows = head(resolve_trace(trace), limit).requests
    simulated = simulate(
        rows,
        policy=policy,
        profiles=profiles,
        chunked_prefill_tokens=chunked_prefill_tokens,
        prefill_workers=prefill_workers,
        # The live placer chooses the decode worker with the prefill worker.
        decode_at_arrival=prefill_workers is not None,
        heartbeat_s=sim_heartbeat_s(speedup),
    )
    agreement = compare(
        result.records,
        simulated,
        speedup=speedup,
        trace=trace,
        policy=policy,
        workers=profiles,
    )
    return agreement, result
