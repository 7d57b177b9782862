"""The window simulator (SneakPeek): workload, plan checks, real inference and scoring.

One module-scoped build of the bundled registry (three applications, three variants,
about 8 s) serves every test. The schedulers are tiny ones defined here, so these tests
do not depend on the real schedulers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from switchyard.apps.profiling import build_registry
from switchyard.apps.registry import Registry
from switchyard.policies.base import DecisionContext
from switchyard.selection.base import WindowPlan
from switchyard.selection.registry import make_window_scheduler, window_scheduler_names
from switchyard.selection.snapshot import WindowSnapshot
from switchyard.selection.views import app_view

from research.window.config import WindowSimConfig
from research.window.simulator import PlanError, WindowSimulator
from tests.unit.window_schedulers import MostAccurate


class DropsOne(MostAccurate):
    name = "test-drops-one"

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        plan = super().schedule(snapshot, ctx)
        return dataclasses.replace(plan, batches=plan.batches[:-1])


class Twice(MostAccurate):
    name = "test-twice"

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        plan = super().schedule(snapshot, ctx)
        first = plan.batches[0].request_ids[0]
        return dataclasses.replace(plan, short_circuited=(first,))


class RejectsEveryOther(MostAccurate):
    name = "test-rejects"

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        plan = super().schedule(snapshot, ctx)
        kept = plan.batches[::2]
        rejected = tuple((b.request_ids[0], "test: not served") for b in plan.batches[1::2])
        return dataclasses.replace(plan, batches=kept, rejected=rejected)


class ShortCircuitsAll:
    name = "test-short-circuit"
    data_aware = True

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        assert all(r.theta is not None for r in snapshot.requests)
        return WindowPlan(
            batches=(), short_circuited=tuple(r.request_id for r in snapshot.requests)
        )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Registry, Path]:
    out = tmp_path_factory.mktemp("window-apps")
    return build_registry(out, seed=0, repeats=3), out


@pytest.fixture(scope="module")
def simulator(built: tuple[Registry, Path]) -> WindowSimulator:
    registry, folder = built
    return WindowSimulator(registry, folder, WindowSimConfig(windows=30))


def test_the_same_seed_gives_the_same_outcomes_and_another_seed_other_requests(
    built: tuple[Registry, Path], simulator: WindowSimulator
) -> None:
    registry, folder = built
    again = WindowSimulator(registry, folder, WindowSimConfig(windows=30))
    first, second = simulator.run(MostAccurate(), seed=4), again.run(MostAccurate(), seed=4)
    clockless = {"sched_overhead_p50_s", "sched_overhead_p99_s"}

    def metrics(result: object) -> dict[str, object]:
        assert hasattr(result, "metrics")
        return {k: v for k, v in result.metrics().items() if k not in clockless}

    assert metrics(first) == metrics(second)
    assert first.outcomes == second.outcomes
    other = simulator.run(MostAccurate(), seed=5)
    assert [o.label for o in other.outcomes] != [o.label for o in first.outcomes]


def test_requests_split_evenly_arrive_in_their_window_and_follow_the_class_mix(
    built: tuple[Registry, Path],
) -> None:
    registry, folder = built
    config = WindowSimConfig(windows=150, deadline_std_s=0.04)
    result = WindowSimulator(registry, folder, config).run(MostAccurate(), seed=1)
    assert result.requests == 150 * 12
    for window in range(150):
        mine = [o for o in result.outcomes if o.window == window]
        assert sorted(o.app for o in mine) == sorted(registry.names() * 4)
        assert all(0.1 * window <= o.arrival_s < 0.1 * (window + 1) for o in mine)
    relative = np.array([o.deadline_s - o.arrival_s for o in result.outcomes])
    assert relative.min() >= 0.001
    assert abs(relative.mean() - 0.15) < 0.006
    assert 0.03 < relative.std() < 0.05
    for app in registry.applications:
        labels = np.array([o.label for o in result.outcomes if o.app == app.name])
        shares = np.bincount(labels, minlength=len(app.classes)) / labels.size
        # 600 draws per application: a share is within ~2.5 standard errors of its mix.
        assert np.allclose(shares, app.stream_class_mix, atol=0.05), (app.name, shares)


def test_a_tighter_deadline_raises_violations_and_utility_never_exceeds_accuracy(
    built: tuple[Registry, Path], simulator: WindowSimulator
) -> None:
    registry, folder = built
    loose = simulator.run(MostAccurate(), seed=0)
    tight = WindowSimulator(registry, folder, WindowSimConfig(windows=30, deadline_s=0.02)).run(
        MostAccurate(), seed=0
    )
    assert tight.deadline_violation_rate > loose.deadline_violation_rate
    assert tight.mean_violation_s > 0.0
    assert tight.utility < loose.utility
    for result in (loose, tight):
        assert 0.0 <= result.utility <= result.accuracy <= 1.0
        assert result.plan_drift_s == pytest.approx(0.0, abs=1e-9)
        assert result.swaps > 0
        for outcome in result.outcomes:
            assert outcome.how == "batch"
            assert 0.0 <= outcome.utility <= float(outcome.correct)
    # Real inference: the most accurate variants are right on most real rows.
    assert loose.accuracy > 0.85
    assert loose.accuracy == tight.accuracy  # same requests, same variants, same answers


def test_a_plan_that_drops_or_repeats_a_request_is_an_error_naming_the_scheduler(
    simulator: WindowSimulator,
) -> None:
    with pytest.raises(PlanError, match=r"test-drops-one.*neither batched"):
        simulator.run(DropsOne())
    with pytest.raises(PlanError, match=r"test-twice.*appears twice"):
        simulator.run(Twice())


def test_rejected_requests_are_counted_wrong_late_and_worthless(
    simulator: WindowSimulator,
) -> None:
    result = simulator.run(RejectsEveryOther(), seed=2)
    rejected = [o for o in result.outcomes if o.how == "rejected"]
    assert result.rejected == len(rejected) == 30 * 6
    assert all(o.utility == 0.0 and not o.correct and o.late for o in rejected)
    assert {o.reason for o in rejected} == {"test: not served"}
    assert result.accuracy <= 0.5
    assert result.deadline_violation_rate >= 0.5


def test_short_circuited_requests_answer_with_sneakpeeks_label_at_the_window_end(
    simulator: WindowSimulator,
) -> None:
    result = simulator.run(ShortCircuitsAll(), seed=0)
    assert result.short_circuited == result.requests
    assert result.swaps == 0
    for outcome in result.outcomes:
        assert outcome.finish_s == pytest.approx(0.1 * (outcome.window + 1))
    # The kNN label is right on most rows, and every answer is on time.
    assert result.deadline_violation_rate == 0.0
    assert result.utility == result.accuracy > 0.8


def test_app_view_scales_latencies_and_loads(built: tuple[Registry, Path]) -> None:
    registry, _ = built
    application = registry.applications[0]
    view = app_view(application, latency_scale=100.0, load_scale=10.0)
    assert [v.name for v in view.variants] == list(application.variants)
    for variant in view.variants:
        profile = application.variants[variant.name]
        for size, batch_s in profile.latency_s["cpu"].items():
            assert variant.latency_s["cpu"][size] == pytest.approx(batch_s * 100.0)
        assert variant.load_s == pytest.approx(profile.load_s * 10.0)
        assert variant.accuracy == profile.accuracy
    assert (
        app_view(application).variants[0].load_s
        == application.variants[view.variants[0].name].load_s
    )
    with pytest.raises(ValueError, match="latency_scale"):
        app_view(application, latency_scale=0.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("requests_per_window", 0),
        ("window_s", float("nan")),
        ("deadline_std_s", -1.0),
        ("penalty", "cubic"),
        ("index", "lsh"),
        ("prior", "flat"),
        ("workers", 0),
    ],
)
def test_a_bad_setting_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        WindowSimConfig(**{field: value})  # type: ignore[arg-type]


def test_more_apps_than_the_registry_run_copies_and_penalty_override_applies(
    built: tuple[Registry, Path],
) -> None:
    registry, folder = built
    config = WindowSimConfig(windows=5, apps=4, requests_per_window=10, penalty="step")
    sim = WindowSimulator(registry, folder, config)
    assert sim.app_names == (*registry.names(), f"{registry.names()[0]}#2")
    assert all(view.penalty.kind == "step" for view in sim.views.values())
    result = sim.run(MostAccurate())
    counts = {name: sum(1 for o in result.outcomes if o.app == name) for name in sim.app_names}
    assert list(counts.values()) == [15, 15, 10, 10]


@pytest.mark.parametrize("name", window_scheduler_names())
def test_malformed_requests_are_rejected_by_name_and_the_rest_of_each_window_runs(
    built: tuple[Registry, Path], name: str
) -> None:
    # A fifth of the requests are spoilt: a NaN feature, a vector one short, or an
    # application nobody registered. None may crash a scheduler; each is rejected with
    # a reason naming the field, and every other request is answered and scored.
    registry, folder = built
    config = WindowSimConfig(windows=20, malformed_fraction=0.2)
    result = WindowSimulator(registry, folder, config).run(make_window_scheduler(name))

    rejected = [o for o in result.outcomes if o.how == "rejected"]
    answered = [o for o in result.outcomes if o.how != "rejected"]
    assert len(result.outcomes) == 20 * 12
    assert 0.1 < len(rejected) / len(result.outcomes) < 0.35
    reasons = {o.reason.split(":")[0].split("[")[0] for o in rejected if o.reason}
    assert reasons == {"features", "app"}
    assert all(o.finish_s is not None for o in answered)
    assert sum(o.correct for o in answered) / len(answered) > 0.8
