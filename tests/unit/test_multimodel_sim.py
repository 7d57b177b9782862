"""The multi-model simulator, its metrics and the ``switchyard multimodel`` command."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from switchyard.multimodel.model import (
    ModelSpec,
    MultiModelRequest,
    PipelineSpec,
    ResourceVector,
    Stage,
    WorkerSpec,
    Workload,
)
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot
from switchyard.policies.base import DecisionContext

from research.multimodel import command, command_report
from research.multimodel.metrics import (
    coefficient_of_variation,
    percentile,
    responsiveness_s,
    stability,
    steady_stability,
    summarize,
    windowed_means,
)
from research.multimodel.simulator import (
    MultiModelSimConfig,
    PlanError,
    SimulationInputError,
    simulate_multimodel,
)

FREE = MultiModelSimConfig(decision_base_s=0.0, decision_per_change_s=0.0, large_change=None)


class PlaceEverywhereOnce:
    """At the first update, every model onto every worker where it still fits."""

    name = "everywhere-once"

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
        if snapshot.now_s > 0 or any(w.resident for w in snapshot.workers):
            return PlacementPlan()
        load = []
        for worker in snapshot.workers:
            free = worker.free
            for name, spec in snapshot.models.items():
                if spec.resources.fits_in(free):
                    load.append((worker.spec.worker_id, name))
                    free = free - spec.resources
        return PlacementPlan(load=tuple(load))


class FixedPlan:
    """Returns ``plan`` at the first update, nothing after."""

    name = "fixed"

    def __init__(self, plan: PlacementPlan) -> None:
        self.plan = plan
        self.calls = 0

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
        self.calls += 1
        return self.plan if self.calls == 1 else PlacementPlan()


class FirstHolder:
    """The first worker (in snapshot order) where the model is ready; ties to queue length."""

    def route(self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext) -> str | None:
        best: tuple[float, str] | None = None
        for worker in snapshot.workers:
            for resident in worker.resident:
                if resident.model == model and resident.ready_at_s <= snapshot.now_s:
                    key = (worker.queued_work_s, worker.spec.worker_id)
                    if best is None or key < best:
                        best = key
        return None if best is None else best[1]


def model(name: str, exec_s: float, *, gpu: float = 0.25, load_s: float = 0.0) -> ModelSpec:
    return ModelSpec(
        name=name, resources=ResourceVector(1.0, gpu, 4.0), load_s=load_s, exec_s=exec_s
    )


def worker(worker_id: str, *, gpu: float = 1.0, speed: float = 1.0) -> WorkerSpec:
    return WorkerSpec(
        worker_id=worker_id,
        gpu_type="T4",
        capacity=ResourceVector(16.0, gpu, 64.0),
        speed=speed,
    )


def diamond_workload(arrivals: Sequence[float], *, step_at_s: float | None = None) -> Workload:
    # a -> (b, c): a's result is shared by b and c; the request ends when both are done.
    models = {"ma": model("ma", 1.0), "mb": model("mb", 2.0), "mc": model("mc", 0.5)}
    pipeline = PipelineSpec(
        name="diamond",
        stages=(
            Stage(name="a", model="ma"),
            Stage(name="b", model="mb", after=("a",)),
            Stage(name="c", model="mc", after=("a",)),
        ),
        slo_s=5.0,
    )
    requests = tuple(
        MultiModelRequest(request_id=f"r{i}", arrival_s=t, pipeline="diamond")
        for i, t in enumerate(arrivals)
    )
    return Workload(
        name="diamond",
        models=models,
        pipelines={"diamond": pipeline},
        requests=requests,
        step_at_s=step_at_s,
    )


def test_one_request_takes_the_critical_path_and_runs_the_shared_stage_once() -> None:
    result = simulate_multimodel(
        diamond_workload([0.0]), (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), FREE
    )
    # a (1.0) then the longer of b (2.0) and c (0.5).
    assert result.latencies_s == pytest.approx((3.0,))
    assert result.stages_run == 3
    assert result.finished == (True,)


def test_speed_divides_service_time() -> None:
    result = simulate_multimodel(
        diamond_workload([0.0]),
        (worker("w0", speed=2.0),),
        PlaceEverywhereOnce(),
        FirstHolder(),
        FREE,
    )
    assert result.latencies_s == pytest.approx((1.5,))


def test_a_plan_that_overflows_a_worker_is_refused_by_name() -> None:
    # Four quarter-GPU models fit; a fifth (after evicting nothing) does not.
    plan = PlacementPlan(
        load=(("w0", "ma"), ("w0", "mb"), ("w0", "mc"), ("w1", "ma"), ("w1", "mb"))
    )
    workload = diamond_workload([0.0])
    big = {**workload.models, "mb": model("mb", 2.0, gpu=0.5), "mc": model("mc", 0.5, gpu=0.5)}
    workload = Workload(
        name="big", models=big, pipelines=workload.pipelines, requests=workload.requests
    )
    with pytest.raises(PlanError, match=r"overflows worker w0: loading ma, mb, mc"):
        simulate_multimodel(
            workload, (worker("w0"), worker("w1")), FixedPlan(plan), FirstHolder(), FREE
        )


def test_evictions_make_room_for_loads_in_the_same_plan() -> None:
    workload = diamond_workload([])
    first = PlacementPlan(load=(("w0", "ma"), ("w0", "mb"), ("w0", "mc"), ("w0", "md")))
    models = {**workload.models, "md": model("md", 1.0), "me": model("me", 1.0)}
    workload = Workload(name="x", models=models, pipelines=workload.pipelines, requests=())

    class TwoStep:
        name = "two-step"

        def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
            if ctx.sequence == 0:
                return first
            if ctx.sequence == 1:
                return PlacementPlan(load=(("w0", "me"),), evict=(("w0", "md"),))
            return PlacementPlan()

    config = MultiModelSimConfig(large_change=None)
    # One late request keeps the run going past the second update.
    late = Workload(
        name="late",
        models=models,
        pipelines=workload.pipelines,
        requests=(MultiModelRequest(request_id="r", arrival_s=2.5, pipeline="diamond"),),
    )
    result = simulate_multimodel(late, (worker("w0"),), TwoStep(), FirstHolder(), config)
    assert result.placement_changes == 4 + 2
    assert result.finished == (True,)


def test_loading_delays_service_by_the_load_time() -> None:
    workload = diamond_workload([0.0])
    slow = {name: model(name, spec.exec_s, load_s=4.0) for name, spec in workload.models.items()}
    workload = Workload(
        name="slow", models=slow, pipelines=workload.pipelines, requests=workload.requests
    )
    result = simulate_multimodel(
        workload, (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), FREE
    )
    assert result.latencies_s == pytest.approx((4.0 + 3.0,))


def test_decision_pause_is_charged() -> None:
    config = MultiModelSimConfig(decision_base_s=0.5, decision_per_change_s=0.1, large_change=None)
    result = simulate_multimodel(
        diamond_workload([0.0]), (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), config
    )
    # The first update loads 3 models: routing pauses 0.5 + 3 * 0.1 s.
    assert result.latencies_s == pytest.approx((0.8 + 3.0,))


def test_same_seed_same_results() -> None:
    arrivals = [i * 0.37 for i in range(400)]
    workers = (worker("w0"), worker("w1", speed=2.0), worker("w2", gpu=0.5))

    def once() -> tuple[tuple[float, ...], int]:
        config = MultiModelSimConfig(seed=3)
        result = simulate_multimodel(
            diamond_workload(arrivals), workers, PlaceEverywhereOnce(), FirstHolder(), config
        )
        return result.latencies_s, result.stages_run

    assert once() == once()


def test_a_step_in_load_shows_a_finite_responsiveness() -> None:
    # 1 request / 2 s, then 1 / 0.5 s from 100 s on two workers: a queue builds at first
    # and latency settles at a new level.
    arrivals = [i * 2.0 for i in range(50)] + [100.0 + i * 0.5 for i in range(400)]
    result = simulate_multimodel(
        diamond_workload(arrivals, step_at_s=100.0),
        (worker("w0"), worker("w1")),
        PlaceEverywhereOnce(),
        FirstHolder(),
        FREE,
    )
    metrics = summarize(result)
    assert metrics.responsiveness_s is not None
    assert math.isfinite(metrics.responsiveness_s)
    assert 0 < metrics.responsiveness_s <= 200.0
    assert metrics.unfinished == 0
    assert 0.0 < metrics.utilization <= 100.0


def test_a_workload_without_step_has_no_responsiveness() -> None:
    result = simulate_multimodel(
        diamond_workload([0.0, 1.0]), (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), FREE
    )
    assert summarize(result).responsiveness_s is None


def test_a_pipeline_with_a_cycle_is_refused() -> None:
    workload = diamond_workload([0.0])
    looped = PipelineSpec(
        name="diamond",
        stages=(
            Stage(name="a", model="ma", after=("b",)),
            Stage(name="b", model="mb", after=("a",)),
        ),
        slo_s=1.0,
    )
    bad = Workload(name="bad", models=workload.models, pipelines={"diamond": looped}, requests=())
    with pytest.raises(SimulationInputError, match="cycle"):
        simulate_multimodel(bad, (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), FREE)


def test_utilization_is_the_resource_weighted_busy_share() -> None:
    # One quarter-GPU model busy 1 s out of a 1 s run on one of two workers: the share is
    # 0.25 on w0 and 0 on w1 -> 12.5 %; CoV of (0.25, 0) = 1.
    workload = Workload(
        name="one",
        models={"ma": model("ma", 1.0)},
        pipelines={"p": PipelineSpec(name="p", stages=(Stage(name="a", model="ma"),), slo_s=0.5)},
        requests=(MultiModelRequest(request_id="r", arrival_s=0.0, pipeline="p"),),
    )
    plan = PlacementPlan(load=(("w0", "ma"),))
    result = simulate_multimodel(
        workload, (worker("w0"), worker("w1")), FixedPlan(plan), FirstHolder(), FREE
    )
    metrics = summarize(result)
    assert metrics.utilization == pytest.approx(12.5)
    assert metrics.load_cov == pytest.approx(1.0)
    assert metrics.slo_violation_rate == 1.0


def test_stability_is_measured_within_steady_segments() -> None:
    # Warm-up (0..30 s) and the 30 s after a step at 100 s are cut; the level may change
    # at the step, only the variation around each segment's own level counts.
    windows = [(0.0, 9.0), (10.0, 5.0)]
    windows += [(30.0 + 10 * k, 1.0) for k in range(7)]  # 30 .. 90: flat at 1
    windows += [(100.0, 20.0), (110.0, 8.0)]  # the step's transient
    windows += [(130.0, 1.0), (140.0, 2.0), (150.0, 3.0)]  # steady at a higher level
    expected = (7 * 1.0 + 3 * stability([1.0, 2.0, 3.0])) / 10
    assert steady_stability(windows, 100.0) == pytest.approx(expected)
    # A level shift alone (flat before, flat after) is perfectly stable.
    shift = [(30.0 + 10 * k, 1.0) for k in range(7)] + [(130.0 + 10 * k, 3.0) for k in range(5)]
    assert steady_stability(shift, 100.0) == 1.0
    # Without a step only the warm-up is cut; with too few windows, the whole run counts.
    assert steady_stability([(0.0, 9.0), (30.0, 1.0), (40.0, 1.0)], None) == 1.0
    assert steady_stability([(0.0, 1.0), (10.0, 3.0)], None) == stability([1.0, 3.0])


def test_metrics_on_a_hand_made_series() -> None:
    assert stability([1.0, 2.0, 3.0]) == pytest.approx(1 - math.sqrt(2 / 3) / 2)
    assert stability([2.0, 2.0, 2.0]) == 1.0
    assert stability([0.0, 0.0, 9.0]) == 0.0  # CoV sqrt(2) > 1: clipped
    assert coefficient_of_variation([0.2, 0.6]) == pytest.approx(0.5)
    assert coefficient_of_variation([0.0, 0.0]) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert windowed_means([0.0, 1.0, 6.0], [1.0, 3.0, 2.0], 5.0) == [(0.0, 2.0), (5.0, 2.0)]
    windows = [(90.0, 1.0)] + [
        (100.0 + 10 * k, mean) for k, mean in enumerate((5.0, 3.0, 2.1, 2.0, 2.0, 2.0))
    ]
    # Smoothed over three windows: (5, 4, 3.37, 2.37, 2.03, 2), within 25 % of 2 from the
    # fourth window, which ends 40 s after the step.
    assert responsiveness_s(windows, 10.0, 100.0) == pytest.approx(40.0)
    assert responsiveness_s(windows, 10.0, None) is None


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--workers", "0"), "--workers must be at least 1"),
        (("--seeds", "0"), "--seeds must be at least 1"),
        (("--workload", "nope"), "--workload must be one of"),
        (("--duration-s", "-1"), "--duration-s must be"),
        (("--values", "1,2"), "--values needs --sweep"),
        (("--sweep", "fluctuation", "--values", "2"), "within [0, 1]"),
        (("--sweep", "update-frequency", "--values", "0"), "must be > 0 Hz"),
        (("--sweep", "fluctuation"), "needs --workload synthetic"),
    ],
)
def test_bad_inputs_are_one_line_and_exit_2(
    argv: tuple[str, ...], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert command.run(_args(*argv)) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_format_table_averages_seeds() -> None:
    base = {key: 1.0 for key, _, _ in command_report.METRICS}
    runs = [
        {**base, "policy": "p", "sweep": "fluctuation", "value": 0.5, "seed": 0, "p99_s": 1.0},
        {**base, "policy": "p", "sweep": "fluctuation", "value": 0.5, "seed": 1, "p99_s": 3.0},
    ]
    (row,) = command_report.aggregate(runs)
    assert row["p99_s"] == 2.0
    assert "fluctuation" in command_report.format_table(runs).splitlines()[0]


def test_a_sweep_writes_every_run_and_a_plot_per_metric(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    report = tmp_path / "report"
    argv = (
        "--workload", "synthetic", "--workers", "4", "--duration-s", "40", "--seeds", "1",
        "--policies", "static-rr,adaptive", "--sweep", "fluctuation", "--values", "0,1",
        "--json", str(out), "--report", str(report),
    )  # fmt: skip
    assert command.run(_args(*argv)) == 0

    runs = json.loads(out.read_text())["runs"]
    assert {(r["policy"], r["sweep"], r["value"]) for r in runs} == {
        (policy, "fluctuation", value) for policy in ("static-rr", "adaptive") for value in (0, 1)
    }
    for run in runs:
        for key in ("utilization", "load_cov", "stability", "p99_s", "slo_violation_rate"):
            assert run[key] is not None
    pngs = {p.name for p in report.glob("*.png")}
    assert {"fluctuation_utilization.png", "fluctuation_load_cov.png"} <= pngs
    assert "fluctuation_stability.png" in (report / "index.html").read_text()
