"""The fault kinds of the fault matrix: what each one does to a running stack.

Each :class:`Fault` is one coroutine that injects the fault and, where there is one,
heals it (a process restarted, a process woken, the network given back), while the
replay goes on. It returns when the fault is over, with the wall times of both. The
stack it runs on (:func:`loadgen.harness.fault_run.start_fault_stack`) is the same for
every fault: a monitor, a predictor, a rebalancer, one scheduler (two for
the scheduler faults), three emulated LLM workers and an ingress, each its own process,
over a broker and a Redis of the run's own (:class:`~loadgen.harness.infra.PrivateInfra`).
A fault whose replay has classification calls (``classification_share``) also runs the
estimator and a worker with the real torch models; one whose replay has pipeline calls
(``pipeline_share``) also runs the placement service and two emulated multi-model nodes
(:data:`MODEL_WORKERS`), which serve the ``txt2img`` catalogue's stages.

A killed service is started again by the harness where a supervisor (compose's
``restart``, a Deployment) would do it; a killed worker and a killed scheduler replica
are not: the others must take over their work.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from loadgen.harness.infra import PrivateInfra
from loadgen.harness.network_cut import NetworkCut
from loadgen.harness.process_stack import ProcessStack
from loadgen.harness.recovery import busiest_worker

WORKERS = ("w1", "w2", "w3")
"""The emulated LLM workers of every fault's stack."""
TORCH_WORKER = "t1"
"""The torch worker of a stack with classification calls (not one of :data:`WORKERS`:
the worker faults pick among those)."""
MODEL_WORKERS = ("m1", "m2")
"""The emulated multi-model nodes of a stack with pipeline calls (not among
:data:`WORKERS`: ``models-worker-kill`` picks among these)."""
CUT_WORKER = "w3"
"""The worker started as a user of its own, the one ``worker-cut`` cuts off."""
RESTART_AFTER_S = 1.0
"""How long a killed service stays down before it is started again."""
PAST_TIMEOUT_S = 3.0
"""How much longer than its timeout (the worker timeout, a scheduler's group session) a
process stays frozen or cut off."""
SLOW_FOR_S = 10.0
SLOW_DUTY = (0.2, 0.2)
"""A slow worker: stopped 0.2 s of every 0.4 s (half speed, in bursts) for 10 s, still
heartbeating within the timeout."""


@dataclass
class FaultContext:
    """What a fault may touch, and the log of what it did."""

    stack: ProcessStack
    infra: PrivateInfra
    cut: NetworkCut | None = None
    events: list[tuple[float, str]] = field(default_factory=list)

    def note(self, what: str) -> float:
        now_s = time.time()
        self.events.append((now_s, what))
        return now_s

    async def busiest_worker(self, among: tuple[str, ...] = WORKERS) -> str:
        """The running worker of ``among`` holding the most requests now."""
        running = [w for w in among if self.stack.processes[w].running()]
        return await busiest_worker(self.stack, running)

    async def kill_and_restart(self, name: str) -> tuple[float, float]:
        killed_at_s = self.stack.kill(name)
        self.note(f"SIGKILL {name}")
        await asyncio.sleep(RESTART_AFTER_S)
        self.stack.restart(name)
        return killed_at_s, self.note(f"restarted {name}")


SCHEDULER_GROUP_ENV: Mapping[str, str] = {
    "SWITCHYARD_LLM_DISPATCH": "scheduler",
    # The compose stack's setting: a replica that stops heartbeating loses its
    # partitions to the other after about this long.
    "SWITCHYARD_KAFKA_SESSION_TIMEOUT_MS": "3000",
}
"""The stack of the scheduler faults: every LLM request through the scheduler group."""

FaultRun = Callable[[FaultContext], Awaitable[tuple[float, float]]]


@dataclass(frozen=True)
class Fault:
    """One fault kind.

    Attributes:
        name: its name on the command line and in the table.
        summary: what it does, in a few words.
        run: injects it (and heals it); returns the wall times of both.
        env: ``SWITCHYARD_*`` variables of the stack it runs on.
        schedulers: scheduler replicas in that stack.
        classification_share: the fraction of the replay's calls that are
            classification calls; above 0 the stack also runs the estimator and
            :data:`TORCH_WORKER`.
        pipeline_share: the fraction of the replay's calls that are pipeline calls;
            above 0 the stack also runs the placement service and
            :data:`MODEL_WORKERS`.
    """

    name: str
    summary: str
    run: FaultRun
    env: Mapping[str, str] = field(default_factory=dict)
    schedulers: int = 1
    classification_share: float = 0.0
    pipeline_share: float = 0.0


def _kill_busiest(among: tuple[str, ...]) -> FaultRun:
    """SIGKILL of the busiest worker of ``among``, not restarted."""

    async def run(ctx: FaultContext) -> tuple[float, float]:
        victim = await ctx.busiest_worker(among)
        killed_at_s = ctx.stack.kill(victim)
        ctx.note(f"SIGKILL {victim}")
        return killed_at_s, killed_at_s

    return run


async def _worker_freeze(ctx: FaultContext) -> tuple[float, float]:
    victim = await ctx.busiest_worker()
    process = ctx.stack.processes[victim].popen
    process.send_signal(signal.SIGSTOP)
    stopped_at_s = ctx.note(f"SIGSTOP {victim}")
    await asyncio.sleep(ctx.stack.worker_timeout_s + PAST_TIMEOUT_S)
    process.send_signal(signal.SIGCONT)
    return stopped_at_s, ctx.note(f"SIGCONT {victim}")


async def _worker_cut(ctx: FaultContext) -> tuple[float, float]:
    if ctx.cut is None:
        raise RuntimeError("worker-cut needs a stack whose cut worker runs as its own user")
    ctx.cut.cut()
    cut_at_s = ctx.note(f"network cut: {CUT_WORKER}")
    try:
        await asyncio.sleep(ctx.stack.worker_timeout_s + PAST_TIMEOUT_S)
    finally:
        ctx.cut.restore()
    return cut_at_s, ctx.note(f"network back: {CUT_WORKER}")


async def _worker_slow(ctx: FaultContext) -> tuple[float, float]:
    victim = await ctx.busiest_worker()
    process = ctx.stack.processes[victim].popen
    began_s = ctx.note(f"slow {victim}: stopped {SLOW_DUTY[0]} s of every {sum(SLOW_DUTY)} s")
    stopped, running = SLOW_DUTY
    try:
        while time.time() - began_s < SLOW_FOR_S:
            process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(stopped)
            process.send_signal(signal.SIGCONT)
            await asyncio.sleep(running)
    finally:
        process.send_signal(signal.SIGCONT)
    return began_s, ctx.note(f"{victim} at full speed again")


def _kill_and_restart(name: str) -> FaultRun:
    async def run(ctx: FaultContext) -> tuple[float, float]:
        return await ctx.kill_and_restart(name)

    return run


async def _scheduler_kill(ctx: FaultContext) -> tuple[float, float]:
    killed_at_s = ctx.stack.kill("scheduler")
    ctx.note("SIGKILL scheduler (one of two replicas)")
    return killed_at_s, killed_at_s


async def _scheduler_freeze(ctx: FaultContext) -> tuple[float, float]:
    process = ctx.stack.processes["scheduler"].popen
    process.send_signal(signal.SIGSTOP)
    stopped_at_s = ctx.note("SIGSTOP scheduler (one of two replicas)")
    await asyncio.sleep(int(SCHEDULER_GROUP_ENV["SWITCHYARD_KAFKA_SESSION_TIMEOUT_MS"]) / 1000)
    await asyncio.sleep(PAST_TIMEOUT_S)
    process.send_signal(signal.SIGCONT)
    return stopped_at_s, ctx.note("SIGCONT scheduler")


async def _broker_kill(ctx: FaultContext) -> tuple[float, float]:
    killed_at_s = ctx.infra.kill_kafka()
    ctx.note("SIGKILL the Kafka broker")
    await asyncio.to_thread(ctx.infra.start_kafka)
    return killed_at_s, ctx.note("the broker answers again")


async def _broker_restart(ctx: FaultContext) -> tuple[float, float]:
    began_s = ctx.note("SIGTERM the Kafka broker (a graceful restart)")
    await asyncio.to_thread(ctx.infra.stop_kafka)
    ctx.note("the broker has stopped")
    await asyncio.to_thread(ctx.infra.start_kafka)
    return began_s, ctx.note("the broker answers again")


async def _redis_empty(ctx: FaultContext) -> tuple[float, float]:
    killed_at_s = ctx.infra.kill_redis()
    ctx.infra.wipe_redis()
    ctx.note("SIGKILL Redis and remove its append-only file (as without persistence)")
    await asyncio.sleep(RESTART_AFTER_S)
    await asyncio.to_thread(ctx.infra.start_redis)
    return killed_at_s, ctx.note("Redis answers again, empty")


async def _redis_kill(ctx: FaultContext) -> tuple[float, float]:
    killed_at_s = ctx.infra.kill_redis()
    ctx.note("SIGKILL Redis (append-only file, fsync every second)")
    await asyncio.sleep(RESTART_AFTER_S)
    await asyncio.to_thread(ctx.infra.start_redis)
    return killed_at_s, ctx.note("Redis answers again")


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault(
            "worker-kill", "SIGKILL of the busiest worker (not restarted)", _kill_busiest(WORKERS)
        ),
        Fault(
            "worker-freeze",
            "SIGSTOP of the busiest worker past the worker timeout, then SIGCONT",
            _worker_freeze,
        ),
        Fault(
            "worker-cut",
            "a worker's packets dropped past the worker timeout, its process alive",
            _worker_cut,
        ),
        Fault("worker-slow", "a worker stopped half of the time for 10 s", _worker_slow),
        Fault(
            "models-worker-kill",
            "SIGKILL of the busiest multi-model node (not restarted); a third of the calls "
            "are pipelines",
            _kill_busiest(MODEL_WORKERS),
            pipeline_share=1 / 3,
        ),
        Fault(
            "ingress-kill",
            "SIGKILL of the ingress the client calls, restarted 1 s later; a quarter of the "
            "calls are pipelines, which the ingress coordinates",
            _kill_and_restart("ingress"),
            pipeline_share=1 / 4,
        ),
        Fault(
            "scheduler-kill",
            "SIGKILL of one of two scheduler replicas, every request through them",
            _scheduler_kill,
            env=SCHEDULER_GROUP_ENV,
            schedulers=2,
        ),
        Fault(
            "scheduler-freeze",
            "SIGSTOP of one of two scheduler replicas past its session, then SIGCONT",
            _scheduler_freeze,
            env=SCHEDULER_GROUP_ENV,
            schedulers=2,
        ),
        Fault(
            "monitor-kill",
            "SIGKILL of the monitor, restarted 1 s later",
            _kill_and_restart("monitor"),
        ),
        Fault(
            "predictor-kill",
            "SIGKILL of the predictor, restarted 1 s later",
            _kill_and_restart("predictor"),
        ),
        Fault(
            "estimator-kill",
            "SIGKILL of the estimator, restarted 1 s later; a third of the calls classify",
            _kill_and_restart("estimator"),
            classification_share=1 / 3,
        ),
        Fault(
            "placement-kill",
            "SIGKILL of the placement service, restarted 1 s later; a third of the calls "
            "are pipelines",
            _kill_and_restart("placement"),
            pipeline_share=1 / 3,
        ),
        Fault(
            "rebalancer-kill",
            "SIGKILL of the rebalancer, restarted 1 s later",
            _kill_and_restart("rebalancer"),
        ),
        Fault(
            "broker-kill",
            "SIGKILL of the Kafka broker, restarted at once; a quarter of the calls are pipelines",
            _broker_kill,
            pipeline_share=1 / 4,
        ),
        Fault("broker-restart", "a graceful restart of the Kafka broker", _broker_restart),
        Fault("redis-kill", "SIGKILL of Redis, restarted 1 s later", _redis_kill),
        Fault(
            "redis-empty",
            "SIGKILL of Redis, restarted 1 s later without its data; a quarter of the calls "
            "are pipelines",
            _redis_empty,
            pipeline_share=1 / 4,
        ),
    )
}
