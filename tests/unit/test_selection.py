"""Window schedulers (SneakPeek model selection) over hand-built snapshots."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest
from switchyard.apps.penalty import Penalty
from switchyard.policies.base import DecisionContext
from switchyard.selection.base import WindowPlan, batch_latency_s
from switchyard.selection.grouped import GroupedScheduler, group_requests
from switchyard.selection.registry import (
    UnknownSchedulerError,
    make_window_scheduler,
    window_scheduler_names,
)
from switchyard.selection.snapshot import (
    AppView,
    VariantView,
    WindowRequest,
    WindowSnapshot,
    WorkerSlot,
)
from switchyard.selection.timeline import BatchSpec, score_plan, validate_requests

STEP = Penalty(kind="step")
MS = 1e-3
"""One millisecond: the hand-built windows below are written in milliseconds."""
ALL = window_scheduler_names()


def variant(
    name: str, accuracy: float, run_s: float, *, load_s: float = 0.0, worker_type: str = "gpu"
) -> VariantView:
    return VariantView(
        name=name,
        latency_s={worker_type: {1: run_s, 8: run_s * 2, 32: run_s * 4}},
        load_s=load_s,
        accuracy=accuracy,
        recall=(accuracy, accuracy),
    )


def app(name: str, *variants: VariantView, penalty: Penalty = STEP) -> AppView:
    return AppView(name=name, num_classes=2, penalty=penalty, variants=variants)


def two_speed(name: str = "a") -> AppView:
    """A fast, less accurate variant and a slow, accurate one; no swap cost."""
    return app(name, variant("fast", 0.7, 2.0 * MS), variant("slow", 0.9, 10.0 * MS))


def req(
    request_id: str,
    app_name: str,
    deadline_s: float,
    *,
    theta: tuple[float, ...] | None = None,
    estimates: Mapping[str, float] | None = None,
) -> WindowRequest:
    return WindowRequest(
        request_id=request_id,
        app=app_name,
        arrival_s=0.0,
        deadline_s=deadline_s,
        theta=theta,
        expected_accuracy=estimates,
    )


def snap(
    requests: list[WindowRequest],
    apps: list[AppView],
    *,
    workers: int = 1,
    loaded: tuple[str, str] | None = None,
) -> WindowSnapshot:
    return WindowSnapshot(
        now_s=0.0,
        requests=tuple(requests),
        apps={a.name: a for a in apps},
        workers=tuple(
            WorkerSlot(worker_id=f"w{i}", worker_type="gpu", free_at_s=0.0, loaded=loaded)
            for i in range(workers)
        ),
    )


def run(name: str, snapshot: WindowSnapshot, *, tau: int = 5, seed: int = 0) -> WindowPlan:
    return make_window_scheduler(name, tau=tau).schedule(
        snapshot, DecisionContext(rng=random.Random(seed))
    )


def order(plan: WindowPlan) -> list[str]:
    return [i for b in plan.batches for i in b.request_ids]


def mixed_window() -> WindowSnapshot:
    """Two applications, estimates on every request, one unknown application."""
    requests = [
        req(
            f"r{i}",
            "a" if i % 2 else "b",
            (5.0 + 7.0 * i) * MS,
            theta=(0.9, 0.1) if i % 3 else (0.45, 0.55),
            estimates={"fast": 0.8, "slow": 0.85},
        )
        for i in range(10)
    ]
    requests.append(req("lost", "nope", 50.0 * MS))
    return snap(requests, [two_speed("a"), two_speed("b")], workers=2)


# -- arithmetic --------------------------------------------------------------------------


def test_batch_latency_worked_example() -> None:
    v = VariantView(
        name="v",
        latency_s={"gpu": {1: 0.002, 8: 0.005, 32: 0.012}},
        load_s=0.0,
        accuracy=1,
        recall=(),
    )
    assert batch_latency_s(v, "gpu", 1) == 0.002
    assert batch_latency_s(v, "gpu", 5) == 0.005
    assert batch_latency_s(v, "gpu", 40) == pytest.approx(0.024)
    assert batch_latency_s(v, "gpu", 0) == 0.0


@pytest.mark.parametrize(
    "penalty",
    [
        Penalty(kind="step"),
        Penalty(kind="linear", span_s=0.1),
        Penalty(kind="sigmoid", steepness_per_s=100.0, midpoint_s=0.05),
        Penalty(kind="sigmoid", steepness_per_s=2000.0, midpoint_s=0.0),
    ],
)
def test_the_search_s_late_total_matches_the_penalty(penalty: Penalty) -> None:
    # Five requests 0.9..0.5 accurate with deadlines 0..40 ms; answered at 60 ms, the
    # first three (deadlines before it) are late by 60, 50 and 40 ms.
    accs, deadlines = [0.9, 0.8, 0.7, 0.6, 0.5], [0.0, 0.01, 0.02, 0.07, 0.08]
    expected = sum(
        a * penalty.factor(0.06 - d) for a, d in zip(accs[:3], deadlines[:3], strict=True)
    )
    zeros = [0.0] * 5
    assert penalty.late_total()(accs, zeros, deadlines, 3, 0.06) == pytest.approx(
        expected, abs=1e-12
    )
    assert penalty.late_total()(accs, zeros, deadlines, 0, 0.06) == 0.0
    # With floors (what SneakPeek's label would earn), each late request counts the more.
    floors = [0.0, 0.75, 0.1, 0.2, 0.2]
    floored = sum(
        max(a * penalty.factor(0.06 - d), f)
        for a, d, f in zip(accs[:3], deadlines[:3], floors[:3], strict=True)
    )
    assert penalty.late_total()(accs, floors, deadlines, 3, 0.06) == pytest.approx(
        floored, abs=1e-12
    )
    assert penalty.late_total()(accs, floors, deadlines, 0, 0.06) == 0.0


def test_swap_is_paid_only_when_the_variant_changes() -> None:
    a = app(
        "a",
        variant("small", 0.7, 3.0 * MS, load_s=4.0 * MS),
        variant("large", 0.9, 10.0 * MS, load_s=4.0 * MS),
    )
    requests = [req("x", "a", 100.0 * MS), req("y", "a", 100.0 * MS), req("z", "a", 100.0 * MS)]
    scored = score_plan(
        snap(requests, [a], loaded=("a", "small")),
        [
            BatchSpec("a", "small", ("x",)),
            BatchSpec("a", "large", ("y",)),
            BatchSpec("a", "large", ("z",)),
        ],
    )
    assert [(b.start_s, b.swap_s, b.end_s) for b in scored.batches] == [
        pytest.approx((0.0, 0.0, 3 * MS)),
        pytest.approx((3 * MS, 4 * MS, 17 * MS)),
        pytest.approx((17 * MS, 0.0, 27 * MS)),
    ]
    cold = score_plan(snap(requests[:1], [a]), [BatchSpec("a", "small", ("x",))])
    assert cold.batches[0].swap_s == pytest.approx(
        4 * MS
    )  # nothing resident: the first batch loads
    assert scored.total_utility == pytest.approx(0.7 + 0.9 + 0.9)


# -- baselines ---------------------------------------------------------------------------


def test_edf_orders_by_deadline() -> None:
    window = snap(
        [req("late", "a", 100.0 * MS), req("early", "b", 30.0 * MS), req("mid", "c", 60.0 * MS)],
        [two_speed("a"), two_speed("b"), two_speed("c")],
    )
    for name in ("maxacc-edf", "lo-edf"):
        assert order(run(name, window)) == ["early", "mid", "late"]


def test_maxacc_takes_the_most_accurate_variant_even_when_late() -> None:
    plan = run("maxacc-edf", snap([req("x", "a", 1.0 * MS)], [two_speed()]))
    assert plan.batches[0].variant == "slow"


@pytest.mark.parametrize(("deadline_s", "expected"), [(50 * MS, "slow"), (5 * MS, "fast")])
def test_locally_optimal_variant_depends_on_slack(deadline_s: float, expected: str) -> None:
    plan = run("lo-edf", snap([req("x", "a", deadline_s)], [two_speed()]))
    assert plan.batches[0].variant == expected


def test_lo_counts_the_swap_in_its_choice() -> None:
    # slow would be on time alone, but not after a 20 ms swap
    a = app("a", variant("fast", 0.7, 2.0 * MS), variant("slow", 0.9, 10.0 * MS, load_s=20.0 * MS))
    plan = run("lo-edf", snap([req("x", "a", 15.0 * MS)], [a], loaded=("a", "fast")))
    assert plan.batches[0].variant == "fast"


def test_lo_priority_puts_higher_priority_first() -> None:
    # same deadline; "spread" has variants far apart in accuracy, so a higher priority
    spread = app("spread", variant("fast", 0.1, 2.0 * MS), variant("slow", 0.9, 10.0 * MS))
    flat = app("flat", variant("fast", 0.8, 2.0 * MS), variant("slow", 0.8, 10.0 * MS))
    window = snap([req("f", "flat", 100.0 * MS), req("s", "spread", 100.0 * MS)], [flat, spread])
    assert order(run("lo-priority", window)) == ["s", "f"]
    assert order(run("lo-edf", window)) == ["f", "s"]  # EDF keeps arrival order on ties


def test_same_variant_requests_merge_into_one_batch() -> None:
    window = snap([req(f"r{i}", "a", 100.0 * MS) for i in range(3)], [two_speed()])
    plan = run("lo-edf", window)
    assert len(plan.batches) == 1
    assert plan.batches[0].request_ids == ("r0", "r1", "r2")


# -- grouped -----------------------------------------------------------------------------


def test_brute_force_finds_a_better_order_than_greedy() -> None:
    # "doomed" is the most urgent but cannot make its deadline; running it first (greedy
    # by priority) also makes "saveable" late. The exact search runs "saveable" first.
    doomed = app("doomed", variant("only", 0.9, 20.0 * MS))
    saveable = app("saveable", variant("only", 0.9, 10.0 * MS))
    window = snap(
        [req("d", "doomed", 10.0 * MS), req("s", "saveable", 15.0 * MS)], [doomed, saveable]
    )
    exact = run("grouped", window)
    greedy = run("grouped", window, tau=0)
    assert order(exact) == ["s", "d"]
    assert order(greedy) == ["d", "s"]
    assert exact.expected_utility == pytest.approx(0.9)
    assert greedy.expected_utility == 0.0


def test_label_split_only_for_confident_requests_in_the_data_aware_form() -> None:
    requests = [
        req("zero", "a", 100.0 * MS, theta=(0.9, 0.1)),
        req("one", "a", 100.0 * MS, theta=(0.2, 0.8)),
        req("unsure", "a", 100.0 * MS, theta=(0.5, 0.5)),
        req("unsure2", "a", 100.0 * MS, theta=(0.5, 0.5)),
    ]
    assert list(group_requests(requests, split_by_label=True)) == [
        ("a", 0),
        ("a", 1),
        ("a", None),
    ]
    window = snap(requests, [two_speed()])
    assert len(run("grouped", window).batches) == 1
    batches = {b.request_ids for b in run("grouped-da", window).batches}
    assert batches == {("zero",), ("one",), ("unsure", "unsure2")}


def test_label_splits_stay_within_the_exact_search_bound() -> None:
    def three(app: str, n: int) -> list[WindowRequest]:
        thetas = [(0.9, 0.1), (0.2, 0.8), (0.5, 0.5), (0.9, 0.1)]
        return [req(f"{app}{i}", app, 100.0 * MS, theta=thetas[i]) for i in range(n)]

    # Every application has two confident labels and unconfident requests: splitting all
    # of them would make 9 groups, past tau = 5, and send the search to the greedy order.
    requests = [*three("a", 4), *three("b", 3), *three("c", 3)]
    groups = list(group_requests(requests, split_by_label=True, max_groups=5))
    assert groups == [("a", 0), ("a", 1), ("a", None), ("b", None), ("c", None)]
    # With room for one more group, the next application splits off its commonest label.
    groups = list(group_requests(requests, split_by_label=True, max_groups=6))
    assert ("b", 0) in groups
    assert ("b", 1) not in groups
    assert len(groups) == 6
    assert len(list(group_requests(requests, split_by_label=True))) == 9


def test_short_circuit_takes_a_confident_request_with_a_tight_deadline() -> None:
    window = snap(
        [
            req("tight", "a", 1.0 * MS, theta=(0.95, 0.05)),
            req("loose", "a", 100.0 * MS, theta=(0.6, 0.4)),
        ],
        [two_speed()],
    )
    plan = run("sneakpeek", window)
    assert plan.short_circuited == ("tight",)
    assert order(plan) == ["loose"]
    assert plan.expected_utility == pytest.approx(0.95 + 0.9)
    assert run("grouped-da", window).short_circuited == ()


def test_short_circuit_frees_the_worker_for_a_request_only_a_model_can_answer() -> None:
    """Planned without its label, "a1" earns most from a's accurate variant (0.99, more
    than its label's 0.88), which leaves "b1" the fast one. Searched knowing the label
    can answer "a1", the plan gives the worker to "b1"'s accurate variant instead."""
    a = app("a", variant("fast", 0.7, 2.0 * MS), variant("slow", 0.99, 10.0 * MS))
    b = app("b", variant("fast", 0.7, 2.0 * MS), variant("slow", 0.95, 10.0 * MS))
    window = snap(
        [req("a1", "a", 10.5 * MS, theta=(0.88, 0.12)), req("b1", "b", 13.0 * MS)], [a, b]
    )
    plan = run("sneakpeek", window)
    assert plan.short_circuited == ("a1",)
    assert [(x.app, x.variant) for x in plan.batches] == [("b", "slow")]
    assert plan.expected_utility == pytest.approx(0.88 + 0.95)
    without_label = run("grouped-da", window)
    assert without_label.expected_utility == pytest.approx(0.99 + 0.7)


def test_multi_worker_spreads_groups_across_workers() -> None:
    apps = [two_speed("a"), two_speed("b")]
    window = snap([req("x", "a", 12.0 * MS), req("y", "b", 12.0 * MS)], apps, workers=2)
    plan = run("grouped", window)
    assert {b.worker_id for b in plan.batches} == {"w0", "w1"}
    assert all(b.variant == "slow" and b.end_s == pytest.approx(10 * MS) for b in plan.batches)


@pytest.mark.parametrize("name", ["grouped", "grouped-da", "sneakpeek", "lo-edf", "maxacc-edf"])
def test_expected_utility_is_the_timeline_score_of_the_plan(name: str) -> None:
    window = mixed_window()
    plan = run(name, window)
    data_aware = make_window_scheduler(name).data_aware
    valid, _ = validate_requests(window, use_estimates=data_aware)
    if not data_aware:  # score what the scheduler believed: profiled accuracy
        window = snap(
            [req(r.request_id, r.app, r.deadline_s) for r in valid],
            list(window.apps.values()),
            workers=2,
        )
    specs = [BatchSpec(b.app, b.variant, b.request_ids, b.worker_id) for b in plan.batches]
    scored = score_plan(window, specs, short_circuited=plan.short_circuited)
    assert scored.batches == plan.batches
    assert scored.total_utility == pytest.approx(plan.expected_utility)


# -- every scheduler ---------------------------------------------------------------------


def test_registry_names_and_unknown_name() -> None:
    assert ALL == (
        "maxacc-edf",
        "lo-edf",
        "lo-priority",
        "grouped",
        "maxacc-edf-da",
        "lo-edf-da",
        "lo-priority-da",
        "grouped-da",
        "sneakpeek",
    )
    assert [make_window_scheduler(n).data_aware for n in ALL] == [False] * 4 + [True] * 5
    with pytest.raises(UnknownSchedulerError, match="known: maxacc-edf, lo-edf"):
        make_window_scheduler("nope")
    with pytest.raises(ValueError, match="tau"):
        GroupedScheduler(name="g", data_aware=False, tau=-1)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("tau", [5, 0])
def test_every_request_appears_exactly_once(name: str, tau: int) -> None:
    window = mixed_window()
    plan = run(name, window, tau=tau)
    seen = order(plan) + list(plan.short_circuited) + [i for i, _ in plan.rejected]
    assert sorted(seen) == sorted(r.request_id for r in window.requests)


@pytest.mark.parametrize("name", ALL)
def test_bad_requests_are_rejected_and_the_rest_scheduled(name: str) -> None:
    gpu_less = app("cpu-only", variant("v", 0.9, 1.0 * MS, worker_type="cpu"))
    window = snap(
        [
            req("ok", "a", 50.0 * MS, theta=(0.6, 0.4)),
            req("lost", "nope", 50.0 * MS),
            req("nogpu", "cpu-only", 50.0 * MS),
            req("nan", "a", float("nan")),
        ],
        [two_speed(), gpu_less],
    )
    plan = run(name, window)
    reasons = dict(plan.rejected)
    assert set(reasons) == {"lost", "nogpu", "nan"}
    assert "unknown application 'nope'" in reasons["lost"]
    assert "no variant of 'cpu-only'" in reasons["nogpu"]
    assert reasons["nan"].startswith("deadline_s:")
    assert order(plan) + list(plan.short_circuited) == ["ok"]


def test_data_aware_forms_reject_a_malformed_estimate() -> None:
    window = snap([req("odd", "a", 50.0 * MS, theta=(0.2, 0.3, 0.5))], [two_speed()])
    assert dict(run("sneakpeek", window).rejected)["odd"].startswith("theta:")
    assert order(run("grouped", window)) == ["odd"]  # oblivious: the estimate is ignored


@pytest.mark.parametrize("name", ALL)
def test_same_snapshot_same_plan(name: str) -> None:
    window = mixed_window()
    assert run(name, window, seed=1) == run(name, window, seed=2)


@pytest.mark.parametrize("name", ["maxacc-edf", "lo-edf", "lo-priority", "grouped"])
def test_data_oblivious_forms_ignore_estimates(name: str) -> None:
    window = mixed_window()
    bare = snap(
        [req(r.request_id, r.app, r.deadline_s) for r in window.requests],
        list(window.apps.values()),
        workers=2,
    )
    assert run(name, window) == run(name, bare)


def test_data_aware_maxacc_believes_the_estimate() -> None:
    window = snap([req("x", "a", 100.0 * MS, estimates={"fast": 0.95, "slow": 0.6})], [two_speed()])
    assert run("maxacc-edf", window).batches[0].variant == "slow"
    assert run("maxacc-edf-da", window).batches[0].variant == "fast"
