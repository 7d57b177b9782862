"""The emulated-models backend and the placement orders it carries out.

Most tests drive the backend on a manual clock (time_scale 1: the catalogue's seconds
are the clock's), stepping it with its wake event set so that it never sleeps: times are
then exact. One test runs it on the real clock, much faster than modelled, to its end.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time

import pytest
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    InferenceRequest,
    LLMPayload,
    PlacedState,
    PlacementOrder,
    StagePayload,
    StageResult,
)
from switchyard.multimodel.branching import label_at, unit_of
from switchyard.multimodel.model import ModelSpec, ResourceVector
from switchyard.serving.catalogue import ServingCatalogue

from services.worker.backends import build_backend
from services.worker.backends.base import UnsupportedWorkError
from services.worker.backends.emulated_models import EmulatedModelsBackend
from services.worker.holdings import Holdings
from services.worker.placement import carry_out
from services.worker.queue import LocalQueue, WorkItem
from tests.support.worker import Sink

CAPACITY = ResourceVector(8.0, 1.0, 64.0)
MODELS = {
    spec.name: spec
    for spec in (
        ModelSpec(name="enc", resources=ResourceVector(1.0, 0.25, 4.0), load_s=2.0, exec_s=1.0),
        ModelSpec(name="gen", resources=ResourceVector(2.0, 0.5, 16.0), load_s=10.0, exec_s=4.0),
        ModelSpec(name="up", resources=ResourceVector(2.0, 0.5, 8.0), load_s=5.0, exec_s=3.0),
        ModelSpec(name="huge", resources=ResourceVector(4.0, 2.0, 8.0), load_s=1.0, exec_s=1.0),
        ModelSpec(
            name="check",
            resources=ResourceVector(1.0, 0.25, 4.0),
            load_s=1.0,
            exec_s=1.0,
            labels=(("safe", 0.5), ("unsafe", 0.5)),
        ),
    )
}
T0 = 1000.0
_orders = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.now_s = T0

    def __call__(self) -> float:
        return self.now_s


class Worker:
    """A backend on a manual clock with the queue, holdings and sink a worker gives it."""

    def __init__(
        self, *, speed: float = 1.0, time_scale: float = 1.0, clock: Clock | None = None
    ) -> None:
        self.clock = clock or Clock()
        self.backend = EmulatedModelsBackend(
            "w1",
            MODELS,
            CAPACITY,
            speed=speed,
            gpu_type="a100",
            time_scale=time_scale,
            clock=self.clock,
        )
        self.holdings = Holdings("w1")
        self.sink = Sink()
        self.finished_at: dict[str, float] = {}

    @property
    def queue(self) -> LocalQueue:
        return self.holdings.queue

    def order(self, *, load: tuple[str, ...] = (), unload: tuple[str, ...] = ()) -> None:
        order = PlacementOrder(
            worker_id="w1",
            load=list(load),
            unload=list(unload),
            policy="test",
            plan_id=f"p{next(_orders)}",
            decided_at_s=self.clock.now_s,
        )
        carry_out(order, self.backend.placement, self.holdings)
        self.check_capacity()

    def stage(self, request_id: str, model: str, *, exec_scale: float = 1.0) -> WorkItem:
        assignment = _stage(request_id, model, exec_scale=exec_scale)
        spec = self.backend.describe(assignment)
        item = WorkItem(
            assignment=assignment,
            key=spec.key,
            received_at_s=self.clock.now_s,
            estimate_s=spec.estimate_s,
        )
        self.holdings.add(item)
        return item

    async def at(self, now_s: float) -> None:
        """Move the clock to ``now_s`` and let the backend do what is due then."""
        assert now_s >= self.clock.now_s
        self.clock.now_s = now_s
        awake = asyncio.Event()
        awake.set()  # never sleeps: the test moves the clock
        for _ in range(3):
            await self.backend.step(self.queue, self.sink, admit=True, wake=awake)
            for request_id in self.sink.results:
                self.finished_at.setdefault(request_id, now_s)
            self.check_capacity()

    def check_capacity(self) -> None:
        placement = self.backend.placement
        assert placement.used().fits_in(CAPACITY), placement.used()

    def placed(self) -> dict[str, PlacedState]:
        return {p.model: p.state for p in self.backend.load(list(self.queue)).placed}


def _stage(request_id: str, model: str, *, exec_scale: float = 1.0) -> Assignment:
    payload = StagePayload(
        pipeline="txt2img",
        stage="generate",
        model=model,
        exec_scale=exec_scale,
        inputs={"encode": "x" * 12},
    )
    request = InferenceRequest(
        request_id=request_id, app="txt2img", payload=payload, arrival_s=T0 - 1.0
    )
    return Assignment(
        request=request,
        worker_id="w1",
        variant=model,
        order=0.0,
        policy="test",
        assigned_at_s=T0,
    )


async def test_an_ordered_load_takes_its_load_time_and_holds_its_resources_from_the_start() -> None:
    worker = Worker()
    worker.order(load=("gen",))
    load = worker.backend.load([])
    (placed,) = load.placed
    assert (placed.model, placed.state, placed.ready_in_s) == ("gen", PlacedState.LOADING, 10.0)
    assert load.free.gpu == pytest.approx(0.5)
    assert load.free.mem_bytes == 48 * 1024**3
    assert load.capacity.mem_bytes == 64 * 1024**3
    item = worker.stage("c1.generate", "gen")
    await worker.at(T0 + 9.9)
    assert worker.sink.started_ids == []  # still loading
    await worker.at(T0 + 10.0)
    assert worker.placed() == {"gen": PlacedState.READY}
    assert worker.sink.started_ids == ["c1.generate"]
    await worker.at(T0 + 13.9)
    assert not worker.sink.results
    await worker.at(T0 + 14.0)
    result = worker.sink.results[item.request_id]
    assert isinstance(result, StageResult)
    assert result.model == "gen"
    assert "stage generate of txt2img request c1.generate" in result.output
    assert "encode 12 chars" in result.output
    assert worker.backend.load([]).placed[0].served_total == 1


async def test_a_classifier_answers_a_label_fixed_by_the_request_id() -> None:
    worker = Worker()
    worker.order(load=("check",))
    ids = [f"c{i}.check" for i in range(12)]
    for request_id in ids:
        worker.stage(request_id, "check")
    for second in range(1, len(ids) + 2):  # loaded at 1 s, then one stage a second
        await worker.at(T0 + second)
    labels = {}
    for request_id in ids:
        result = worker.sink.results[request_id]
        assert isinstance(result, StageResult)
        labels[request_id] = result.label
        assert result.label == label_at(MODELS["check"].labels, unit_of(request_id))
    assert set(labels.values()) == {"safe", "unsafe"}
    # A model without labels answers none.
    worker.order(load=("enc",))
    worker.stage("c0.encode", "enc")
    for second in range(len(ids) + 2, len(ids) + 6):
        await worker.at(T0 + second)
    result = worker.sink.results["c0.encode"]
    assert isinstance(result, StageResult)
    assert result.label is None


async def test_a_stage_takes_exec_s_times_its_scale_over_speed_and_time_scale() -> None:
    worker = Worker(speed=2.0, time_scale=10.0)
    worker.order(load=("gen",))  # 10 s / 10
    worker.stage("a", "gen", exec_scale=1.5)  # 4 s * 1.5 / 2 / 10 = 0.3 s
    await worker.at(T0 + 1.0)
    await worker.at(T0 + 1.29)
    assert "a" not in worker.sink.results
    await worker.at(T0 + 1.3)
    assert "a" in worker.sink.results
    assert worker.backend.load([]).speed == 2.0


async def test_one_model_serves_one_stage_at_a_time_and_different_models_run_side_by_side() -> None:
    worker = Worker()
    worker.order(load=("enc", "up"))
    await worker.at(T0 + 5.0)  # both loaded
    for request_id, model in (("e1", "enc"), ("e2", "enc"), ("u1", "up")):
        worker.stage(request_id, model)
    await worker.at(T0 + 5.0)
    assert sorted(worker.sink.started_ids) == ["e1", "u1"]
    assert len(worker.backend.load([]).running) == 2
    await worker.at(T0 + 6.0)
    assert worker.sink.started_ids[-1] == "e2"  # e1 done: the next enc stage
    await worker.at(T0 + 7.0)
    await worker.at(T0 + 8.0)
    assert worker.finished_at == {"e1": T0 + 6.0, "e2": T0 + 7.0, "u1": T0 + 8.0}


async def test_a_load_that_does_not_fit_is_refused_naming_worker_model_and_vectors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Worker()
    worker.order(load=("gen",))
    with caplog.at_level(logging.WARNING, logger="switchyard.worker"):
        worker.order(load=("huge", "gen-9", "enc"))
    assert set(worker.placed()) == {"gen", "enc"}
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 2
    huge = next(line for line in refusals if " huge " in line)
    assert "worker w1" in huge
    assert "needs [cpu 4, gpu 2, mem 8 GiB]" in huge
    assert "[cpu 8, gpu 1, mem 64 GiB]" in huge
    unknown = next(line for line in refusals if "gen-9" in line)
    assert "not in the catalogue" in unknown
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="switchyard.worker"):
        worker.order(load=("enc",))  # placed already: a no-op
    assert not caplog.records
    assert worker.backend.placement.loads_total == 2


async def test_a_load_beside_placed_models_that_leave_too_little_room_is_refused() -> None:
    worker = Worker()
    worker.order(load=("gen", "up"))  # gpu 1.0 of 1.0 used
    worker.order(load=("enc",))
    assert set(worker.placed()) == {"gen", "up"}
    assert not worker.backend.placement.pending


async def test_an_unload_drains_what_its_model_holds_before_the_load_waiting_for_it_starts() -> (
    None
):
    worker = Worker()
    worker.order(load=("gen", "up"))
    await worker.at(T0 + 10.0)
    worker.stage("g1", "gen")
    worker.stage("g2", "gen")
    await worker.at(T0 + 10.0)  # g1 runs, g2 waits
    worker.order(unload=("gen",), load=("enc",))
    assert worker.placed() == {"gen": PlacedState.DRAINING, "up": PlacedState.READY}
    assert worker.backend.placement.pending  # enc waits for gen's resources
    # Draining models are still charged: free stays what gen and up leave.
    assert worker.backend.load([]).free.gpu == pytest.approx(0.0)
    await worker.at(T0 + 14.0)  # g1 done, g2 starts on the draining model
    assert worker.sink.started_ids == ["g1", "g2"]
    assert "gen" in worker.placed()
    await worker.at(T0 + 18.0)  # g2 done: gen gives its resources back, enc loads
    assert worker.placed() == {"up": PlacedState.READY, "enc": PlacedState.LOADING}
    await worker.at(T0 + 20.0)
    assert worker.placed() == {"up": PlacedState.READY, "enc": PlacedState.READY}
    assert set(worker.sink.results) == {"g1", "g2"}


async def test_an_unload_of_a_model_holding_nothing_frees_it_at_once_for_the_orders_loads() -> None:
    worker = Worker()
    worker.order(load=("gen", "up"))
    worker.order(unload=("gen",), load=("enc",))
    assert worker.placed() == {"up": PlacedState.LOADING, "enc": PlacedState.LOADING}


async def test_a_load_of_a_draining_model_cancels_its_drain_and_unknown_unloads_are_ignored() -> (
    None
):
    worker = Worker()
    worker.order(load=("gen",))
    await worker.at(T0 + 10.0)
    worker.stage("g1", "gen")
    await worker.at(T0 + 10.0)
    worker.order(unload=("gen", "up"))
    assert worker.placed() == {"gen": PlacedState.DRAINING}
    worker.order(load=("gen",))
    assert worker.placed() == {"gen": PlacedState.READY}
    await worker.at(T0 + 14.0)
    assert worker.placed() == {"gen": PlacedState.READY}  # kept once its stage finished
    assert worker.backend.placement.loads_total == 1


async def test_a_drain_whose_room_a_waiting_load_counts_on_is_not_cancelled() -> None:
    worker = Worker()
    worker.order(load=("gen", "up"))
    await worker.at(T0 + 10.0)
    worker.stage("g1", "gen")
    await worker.at(T0 + 10.0)
    worker.order(unload=("gen",), load=("enc",))  # enc waits for gen's room
    worker.order(load=("gen",))  # keeping gen would leave enc no room: refused
    assert worker.placed() == {"gen": PlacedState.DRAINING, "up": PlacedState.READY}
    await worker.at(T0 + 14.0)
    assert worker.placed() == {"up": PlacedState.READY, "enc": PlacedState.LOADING}


async def test_a_stage_for_a_model_not_placed_loads_it_on_demand() -> None:
    worker = Worker()
    worker.stage("e1", "enc")
    await worker.at(T0)
    assert worker.placed() == {"enc": PlacedState.LOADING}
    await worker.at(T0 + 2.0)
    await worker.at(T0 + 3.0)
    assert worker.finished_at == {"e1": T0 + 3.0}


async def test_a_stage_whose_model_does_not_fit_now_waits_until_a_drain_frees_room() -> None:
    worker = Worker()
    worker.order(load=("gen", "up"))
    await worker.at(T0 + 10.0)
    worker.stage("u1", "up")
    await worker.at(T0 + 10.0)
    worker.order(unload=("up",))  # draining while u1 runs
    worker.stage("e1", "enc")  # routed here just as placement changed
    await worker.at(T0 + 10.0)
    assert "enc" not in worker.placed()
    assert "e1" in worker.queue
    await worker.at(T0 + 13.0)  # u1 done: up freed, enc loads on demand
    assert worker.placed() == {"gen": PlacedState.READY, "enc": PlacedState.LOADING}
    await worker.at(T0 + 15.0)
    await worker.at(T0 + 16.0)
    assert worker.finished_at["e1"] == T0 + 16.0


def test_a_stage_whose_model_can_never_fit_or_is_unknown_is_refused_at_intake() -> None:
    worker = Worker()
    with pytest.raises(UnsupportedWorkError, match=r"'huge'.*\[cpu 8, gpu 1, mem 64 GiB\]"):
        worker.backend.describe(_stage("h1", "huge"))
    with pytest.raises(UnsupportedWorkError, match="'nope' is not in the catalogue"):
        worker.backend.describe(_stage("n1", "nope"))
    assert worker.backend.servable_models() == ["check", "enc", "gen", "up"]  # not huge
    llm = InferenceRequest(
        request_id="l1",
        app="llama-2-7b",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=10, max_output_tokens=4),
        arrival_s=T0,
    )
    with pytest.raises(UnsupportedWorkError, match="pipeline stages"):
        worker.backend.describe(
            Assignment(
                request=llm,
                worker_id="w1",
                variant="llama-2-7b",
                order=0.0,
                policy="t",
                assigned_at_s=T0,
            )
        )


async def test_utilization_is_the_time_average_busy_share_since_the_last_heartbeat() -> None:
    worker = Worker()
    worker.order(load=("gen",))
    await worker.at(T0 + 10.0)
    worker.backend.load([])  # a heartbeat: the average restarts here
    worker.stage("g1", "gen")
    await worker.at(T0 + 10.0)
    await worker.at(T0 + 14.0)
    await worker.at(T0 + 18.0)
    # gen's dominant share is half the GPU, busy for 4 of the 8 s.
    assert worker.backend.load([]).utilization == pytest.approx(0.25)


async def test_random_orders_and_stages_never_exceed_capacity_and_every_stage_is_answered() -> None:
    rng = random.Random(7)
    worker = Worker()
    names = ["enc", "gen", "up"]
    sent: list[str] = []
    now_s = T0
    for index in range(300):
        roll = rng.random()
        if roll < 0.2:
            worker.order(
                load=tuple(rng.sample(names, rng.randint(0, 2))),
                unload=tuple(rng.sample(names, rng.randint(0, 2))),
            )
        elif roll < 0.7:
            request_id = f"s{index}"
            worker.stage(request_id, rng.choice(names), exec_scale=rng.uniform(0.1, 2.0))
            sent.append(request_id)
        now_s += rng.uniform(0.0, 2.0)
        await worker.at(now_s)
    # Nothing new, and a placer that unloads every model now and then (a stage whose
    # model fits only once others leave waits for that): what was accepted is served.
    for tick in range(300):
        if tick % 20 == 0:
            worker.order(unload=tuple(names))
        now_s += 1.0
        await worker.at(now_s)
    assert set(worker.sink.results) == set(sent)
    assert not worker.sink.errors


async def test_on_the_real_clock_every_stage_that_fits_is_served_and_the_engine_then_idles() -> (
    None
):
    backend = EmulatedModelsBackend("w1", MODELS, CAPACITY, gpu_type="a100", time_scale=1000.0)
    queue, sink = LocalQueue(), Sink()
    for index, model in enumerate(["enc", "gen", "enc", "up", "gen"]):
        assignment = _stage(f"r{index}", model)
        spec = backend.describe(assignment)
        queue.push(
            WorkItem(
                assignment=assignment,
                key=spec.key,
                received_at_s=time.time(),
                estimate_s=spec.estimate_s,
            )
        )
    started = time.monotonic()
    steps = 0
    while await backend.step(queue, sink, admit=True):
        steps += 1
        assert steps < 1000
    # On demand: gen loads in 10 ms and serves two 4 ms stages.
    assert time.monotonic() - started >= 0.018
    assert sorted(sink.results) == ["r0", "r1", "r2", "r4"]
    assert not backend.has_running()
    # up needs half the GPU, and enc and gen hold three quarters of it: its stage waits
    # (kept, not failed) until an unload makes room.
    assert [item.request_id for item in queue] == ["r3"]
    assert not sink.errors


def test_build_backend_makes_one_from_the_settings_and_the_catalogue() -> None:
    settings = load_settings(
        {},
        worker_backend="emulated-models",
        worker_id="w7",
        worker_cpu_cores=16,
        worker_gpus=2,
        worker_host_mem_gib=128,
        worker_speed=1.5,
        worker_gpu_type="h100",
        worker_time_scale=50,
    )
    backend = build_backend(settings, ServingCatalogue(llm={}, classification={}))
    assert isinstance(backend, EmulatedModelsBackend)
    load = backend.load([])
    assert (load.capacity.cpu, load.capacity.gpu, load.capacity.mem_bytes) == (
        16.0,
        2.0,
        128 * 1024**3,
    )
    assert (load.speed, load.gpu_type, backend.worker_type) == (1.5, "h100", "h100")
    assert backend.servable_models() == sorted(ServingCatalogue(llm={}, classification={}).models)
    with pytest.raises(ValueError, match="emulated-models worker needs the serving catalogue"):
        build_backend(settings, None)


class TickingClock(Clock):
    """A clock that moves on by ``tick_s`` at every reading: one step of the backend then
    spans time, as it does on a busy machine (the process descheduled mid-step)."""

    def __init__(self, tick_s: float) -> None:
        super().__init__()
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now_s += self.tick_s
        return self.now_s


@pytest.mark.parametrize("readings_before_the_end", range(1, 8))
async def test_a_load_that_ends_during_a_step_is_not_missed_by_it(
    readings_before_the_end: int,
) -> None:
    """A stage waiting for its model's load is started once the load ends, wherever in a
    step the clock passes the load's end: a step that saw the model loading when it
    looked for stages to start, and loaded when it looked for its next event, would
    otherwise report nothing in progress, and the engine would wait for new work that
    may never come."""
    clock = TickingClock(tick_s=0.001)
    worker = Worker(clock=clock)
    worker.order(load=("enc",))
    ready_at_s = worker.backend.placement.replicas["enc"].ready_at_s
    worker.stage("c1.encode", "enc")
    # The clock passes the load's end after this many readings of the next step.
    clock.now_s = ready_at_s - clock.tick_s * (readings_before_the_end - 0.5)
    awake = asyncio.Event()
    awake.set()  # never sleeps
    for _ in range(4):
        assert await worker.backend.step(worker.queue, worker.sink, admit=True, wake=awake), (
            "the step reported nothing in progress while a stage waited for its model"
        )
        if worker.sink.started_ids:
            break
    assert worker.sink.started_ids == ["c1.encode"]
