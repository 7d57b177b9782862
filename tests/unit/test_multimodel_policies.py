"""Multi-model placement policies and routers over hand-built snapshots: no simulator."""

from __future__ import annotations

import dataclasses
import random

import pytest
from switchyard.multimodel.adaptive import AdaptiveConfig, AdaptivePlacement, placement_cost
from switchyard.multimodel.placement_baselines import (
    LeastLoadedPlacement,
    StaticRoundRobinPlacement,
    ThresholdPlacement,
)
from switchyard.multimodel.policy_registry import (
    UnknownMultiModelPolicyError,
    make_multimodel_policy,
    multimodel_policy_names,
)
from switchyard.multimodel.routing import (
    BalancedWorkRouter,
    GapsHybridRouter,
    JoinShortestQueueRouter,
    LeastWorkRouter,
    RoundRobinRouter,
)
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot, WorkerState
from switchyard.policies.base import DecisionContext

from research.multimodel.scenarios import (
    advance,
    apply_plan,
    model,
    random_snapshot,
    resident,
    snapshot,
    worker_spec,
)

NAMES = multimodel_policy_names()


def ctx(sequence: int = 0, seed: int = 0) -> DecisionContext:
    return DecisionContext(random.Random(seed), sequence)


def held(snap: PlacementSnapshot) -> set[tuple[str, str]]:
    return {(w.spec.worker_id, r.model) for w in snap.workers for r in w.resident}


# -- capacity, for every policy ---------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_plan_fits_every_worker_on_random_snapshots(name: str) -> None:
    rng = random.Random(1234)
    for trial in range(25):
        snap = random_snapshot(rng, n_workers=rng.randrange(1, 12), n_models=rng.randrange(1, 20))
        policy = make_multimodel_policy(name)
        for update in range(3):
            plan = policy.placement.place(snap, ctx(update, seed=trial))
            # apply_plan asserts: evictions of held replicas, loads of missing known
            # models, and every worker's residents within its capacity.
            snap = advance(apply_plan(snap, plan), 1.0)
            for worker in snap.workers:
                assert worker.free.cpu >= 0.0


def test_plans_are_deterministic_whatever_the_random_seed() -> None:
    snap = random_snapshot(random.Random(7), n_workers=10, n_models=15)
    for name in NAMES:
        first = make_multimodel_policy(name).placement.place(snap, ctx(0, seed=1))
        second = make_multimodel_policy(name).placement.place(snap, ctx(0, seed=99))
        assert first == second, name


# -- static-rr ------------------------------------------------------------------------


def test_static_rr_deals_by_popularity_then_never_changes() -> None:
    models = [model("a"), model("b"), model("c", gpu=0.5)]
    workers = [(worker_spec(f"w{i}"), ()) for i in range(3)]
    snap = snapshot(models, workers, demand={"a": 1.0, "b": 5.0, "c": 3.0})
    policy = StaticRoundRobinPlacement()
    plan = policy.place(snap, ctx())
    assert plan.evict == ()
    # Popularity order b, c, a dealt round-robin, pass after pass, until nothing fits.
    assert plan.load[:3] == (("w0", "b"), ("w1", "c"), ("w2", "a"))
    after = apply_plan(snap, plan)
    assert all(w.free.gpu < 0.25 for w in after.workers)
    # Demand shifts completely, queues build, time passes: nothing changes.
    later = advance(after, 60.0)
    later = snapshot(
        models,
        [(w.spec, w.resident) for w in later.workers],
        demand={"a": 50.0, "b": 0.0, "c": 0.0},
        waiting={"a": 40},
        now_s=later.now_s,
    )
    assert policy.place(later, ctx(1)) == PlacementPlan()
    # A replica of its plan that went missing is loaded again, and only that.
    missing = snapshot(
        models,
        [
            (
                w.spec,
                tuple(r for r in w.resident if not (w.spec.worker_id == "w1" and r.model == "c")),
            )
            for w in later.workers
        ],
        now_s=later.now_s,
    )
    assert policy.place(missing, ctx(2)).load == (("w1", "c"),)


# -- threshold ------------------------------------------------------------------------


def test_threshold_adds_a_replica_when_a_queue_builds() -> None:
    models = [model("a"), model("b")]
    workers = [
        (worker_spec("w0"), [resident("a", queued=8, running=1)]),
        (worker_spec("w1"), [resident("b")]),
        (worker_spec("w2"), []),
    ]
    snap = snapshot(
        models, workers, demand={"a": 0.5, "b": 0.1}, utilization={"w0": 1.0, "w1": 0.3}
    )
    plan = ThresholdPlacement().place(snap, ctx())
    assert plan.load == (("w2", "a"),)  # the least-utilised worker that fits
    assert plan.evict == ()


def test_threshold_evicts_an_idle_replica_when_demand_falls() -> None:
    models = [model("a")]
    workers = [
        (worker_spec("w0"), [resident("a", running=1)]),
        (worker_spec("w1"), [resident("a")]),
    ]
    snap = snapshot(models, workers, demand={"a": 0.05}, utilization={"w0": 0.1, "w1": 0.0})
    plan = ThresholdPlacement().place(snap, ctx())
    assert plan == PlacementPlan(evict=(("w1", "a"),))
    # The last replica stays while there is demand at all.
    after = apply_plan(snap, plan)
    assert ThresholdPlacement().place(after, ctx()) == PlacementPlan()


# -- least-loaded ---------------------------------------------------------------------


def test_least_loaded_sizes_replicas_to_demand_on_least_loaded_workers() -> None:
    models = [model("a", exec_s=0.35), model("b", exec_s=0.1)]
    workers = [(worker_spec(f"w{i}"), ()) for i in range(4)]
    snap = snapshot(models, workers, demand={"a": 4.0, "b": 1.0})
    plan = LeastLoadedPlacement().place(snap, ctx())
    # a: 4 x 0.35 = 1.4 busy -> ceil(1.4 / 0.7) = 2 replicas; b: 0.1 -> 1 replica,
    # on a worker a does not load.
    assert sorted(plan.load) == [("w0", "a"), ("w1", "a"), ("w2", "b")]


# -- adaptive -------------------------------------------------------------------------


def converge(
    policy: AdaptivePlacement, snap: PlacementSnapshot, rounds: int = 20
) -> tuple[PlacementSnapshot, int]:
    for update in range(rounds):
        plan = policy.place(snap, ctx(update))
        if plan == PlacementPlan(cost_s=plan.cost_s):
            return snap, update
        snap = apply_plan(snap, plan)
    raise AssertionError(f"not converged after {rounds} updates")


def test_adaptive_moves_demand_toward_fast_workers_and_lowers_its_cost() -> None:
    models = [model("a", exec_s=1.0, load_s=1.0)]
    workers = [
        (worker_spec("slow", speed=1.0), [resident("a", running=1, queued=2)]),
        (worker_spec("fast", speed=4.0), []),
    ]
    snap = snapshot(models, workers, demand={"a": 0.8})
    cfg = AdaptiveConfig(gamma=0.0)  # delay and resources only: no load-balance term
    policy = AdaptivePlacement(cfg)
    before = placement_cost(snap, cfg)
    plan = policy.place(snap, ctx())
    assert ("fast", "a") in plan.load
    after = apply_plan(snap, plan)
    assert plan.cost_s == pytest.approx(placement_cost(after, cfg))
    assert plan.cost_s < before
    # Once the fast replica is ready and the slow one adds little, the slow one goes.
    settled, _ = converge(policy, advance(after, 30.0))
    assert held(settled) == {("fast", "a")}


def test_adaptive_prefers_the_fast_worker_for_a_new_model() -> None:
    models = [model("a")]
    workers = [(worker_spec("w-slow", speed=0.5), ()), (worker_spec("w-fast", speed=2.0), ())]
    snap = snapshot(models, workers, waiting={"a": 3}, demand={"a": 0.2})
    no_balance = AdaptivePlacement(AdaptiveConfig(gamma=0.0))
    assert no_balance.place(snap, ctx()).load == (("w-fast", "a"),)


def test_adaptive_balance_term_spreads_replicas_over_idle_workers() -> None:
    models = [model("a")]
    workers = [(worker_spec("w-slow", speed=0.5), ()), (worker_spec("w-fast", speed=2.0), ())]
    snap = snapshot(models, workers, waiting={"a": 3}, demand={"a": 0.2})
    assert set(AdaptivePlacement().place(snap, ctx()).load) == {("w-fast", "a"), ("w-slow", "a")}


def test_adaptive_does_not_thrash_once_converged() -> None:
    snap = random_snapshot(random.Random(11), n_workers=12, n_models=20)
    policy = AdaptivePlacement()
    settled, _ = converge(policy, snap)
    # The same snapshot twice in a row: no further change.
    for sequence in (1, 2):
        plan = policy.place(settled, ctx(sequence))
        assert (plan.load, plan.evict) == ((), ())
    # Loads finish and replicas age past the minimum residency (120 s): it settles once
    # more, then, demand unchanged, stays put update after update.
    settled, _ = converge(policy, advance(settled, 150.0))
    for second in range(1, 6):
        plan = policy.place(advance(settled, float(second)), ctx(second))
        assert (plan.load, plan.evict) == ((), ())


def test_adaptive_costs_fall_update_after_update() -> None:
    snap = random_snapshot(random.Random(5), n_workers=8, n_models=12)
    policy = AdaptivePlacement(AdaptiveConfig(max_actions=2))
    cost = placement_cost(snap)
    for update in range(6):
        plan = policy.place(snap, ctx(update))
        assert plan.cost_s <= cost + 1e-9
        snap = apply_plan(snap, plan)
        cost = plan.cost_s


def test_adaptive_evicts_an_unused_model_to_make_room_for_a_demanded_one() -> None:
    big = [model("old", gpu=1.0), model("new", gpu=1.0)]
    snap = snapshot(
        big, [(worker_spec("w0"), [resident("old")])], waiting={"new": 4}, demand={"new": 1.0}
    )
    plan = AdaptivePlacement().place(snap, ctx())
    assert plan.evict == (("w0", "old"),)
    assert plan.load == (("w0", "new"),)


def test_adaptive_keeps_a_young_replica() -> None:
    # A whole-worker model nobody uses: worth evicting (beta x 1 > hysteresis), once it
    # is past the 120 s minimum residency. (An unused quarter-worker replica saves
    # beta x 0.25 = 0.5, not more than the hysteresis: it goes only when its room is
    # needed.)
    models = [model("a", gpu=1.0)]
    young = resident("a", ready_at_s=98.5)  # loaded 2 s from 96.5: 3.5 s old at 100
    snap = snapshot(models, [(worker_spec("w0"), [young])], demand={})
    assert AdaptivePlacement().place(snap, ctx()).evict == ()
    assert AdaptivePlacement().place(advance(snap, 116.0), ctx()).evict == ()  # 119.5 s
    assert AdaptivePlacement().place(advance(snap, 117.0), ctx()).evict == (("w0", "a"),)


@pytest.mark.parametrize("name", ["adaptive", "adaptive-balanced"])
def test_adaptive_never_evicts_or_moves_within_the_minimum_residency(name: str) -> None:
    # An unused model on the slow worker, a fast worker free: eviction (and a move) would
    # lower the cost, but not before the replica is 120 s old (from the start of its load).
    models = [model("a", gpu=1.0), model("b", gpu=1.0)]
    loaded_at = 100.0 - 12.0
    workers = [
        (worker_spec("slow", speed=1.0), [resident("a", ready_at_s=loaded_at + 2.0)]),
        (worker_spec("fast", speed=4.0), []),
    ]
    snap = snapshot(models, workers, demand={"a": 0.0})
    policy = make_multimodel_policy(name).placement
    for seconds in (0.0, 50.0, 107.9):  # 12 .. 119.9 s old
        plan = policy.place(advance(snap, seconds), ctx())
        assert ("slow", "a") not in plan.evict, seconds
    assert ("slow", "a") in policy.place(advance(snap, 108.1), ctx()).evict


def test_balanced_adaptive_spreads_a_hot_model_over_fast_and_slow_workers() -> None:
    # 3 stages/s of a 1 s model: more than any one worker serves. The balance term
    # puts replicas on several workers, slow ones included, not only the fast ones.
    models = [model("hot", exec_s=1.0, load_s=2.0), model("cold", exec_s=1.0)]
    workers = [
        (worker_spec(f"w{i}", speed=speed), ()) for i, speed in enumerate((1.0, 1.0, 2.0, 2.0))
    ]
    snap = snapshot(models, workers, waiting={"hot": 6}, demand={"hot": 3.0, "cold": 0.05})
    plan = make_multimodel_policy("adaptive-balanced").placement.place(snap, ctx())
    hot = {worker for worker, name in plan.load if name == "hot"}
    assert len(hot) > 1
    assert hot & {"w0", "w1"}
    assert hot & {"w2", "w3"}


@pytest.mark.parametrize("name", ["adaptive", "adaptive-balanced"])
def test_adaptive_decides_the_same_on_identical_snapshots(name: str) -> None:
    # No hidden clock, state or randomness: the same snapshot gives the same plan, from a
    # fresh instance or the same one, whatever the context's rng and sequence.
    for seed in (3, 4):
        snap = random_snapshot(random.Random(seed), n_workers=24, n_models=30)
        policy = make_multimodel_policy(name).placement
        first = policy.place(snap, ctx(0, seed=1))
        assert policy.place(snap, ctx(5, seed=2)) == first
        assert make_multimodel_policy(name).placement.place(snap, ctx(9, seed=3)) == first


def test_balanced_adaptive_plan_is_a_fixed_point_at_scale() -> None:
    # The lazy search still ends in a local optimum: applied as it is, the same policy
    # finds nothing more to do (no action cap reached, nothing still loading re-priced).
    snap = random_snapshot(random.Random(21), n_workers=64, n_models=100)
    policy = AdaptivePlacement(AdaptiveConfig(max_actions=10_000), name="adaptive-balanced")
    plan = policy.place(snap, ctx())
    after = apply_plan(snap, plan)
    again = policy.place(after, ctx())
    assert (again.load, again.evict) == ((), ())


def test_adaptive_config_rejects_bad_weights() -> None:
    with pytest.raises(ValueError, match="beta"):
        AdaptiveConfig(beta=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        make_multimodel_policy("adaptive", alpha=float("nan"))


# -- routers --------------------------------------------------------------------------


def routing_snapshot() -> PlacementSnapshot:
    models = [model("a", exec_s=1.0), model("b")]
    return snapshot(
        models,
        [
            (worker_spec("w0", speed=1.0), [resident("a", queued=0, running=0)]),
            (worker_spec("w1", speed=2.0), [resident("a", queued=3, running=1)]),
            (worker_spec("w2", speed=4.0), [resident("b")]),
            (worker_spec("w3", speed=2.0), [resident("a", queued=0, running=1)]),
        ],
    )


@pytest.mark.parametrize(
    "router",
    [
        LeastWorkRouter(),
        JoinShortestQueueRouter(),
        RoundRobinRouter(),
        GapsHybridRouter(),
        BalancedWorkRouter(),
    ],
)
def test_routers_pick_holders_only(router: object) -> None:
    snap = routing_snapshot()
    route = router.route  # type: ignore[attr-defined]
    for sequence in range(8):
        assert route("a", snap, ctx(sequence)) in {"w0", "w1", "w3"}
        assert route("b", snap, ctx(sequence)) == "w2"
        assert route("unplaced", snap, ctx(sequence)) is None


def test_least_work_picks_the_least_work_plus_service() -> None:
    snap = routing_snapshot()
    # w0: 0 + 1.0; w1: 4 x 0.5 + 0.5 = 2.5; w3: 1 x 0.5 + 0.5 = 1.0 -> w0 first listed
    assert LeastWorkRouter().route("a", snap, ctx()) == "w0"
    idle_fast = snapshot(
        [model("a")],
        [
            (worker_spec("w0", speed=1.0), [resident("a")]),
            (worker_spec("w1", speed=4.0), [resident("a")]),
        ],
    )
    assert LeastWorkRouter().route("a", idle_fast, ctx()) == "w1"


def test_balanced_work_uses_an_idle_slow_replica_within_its_slack() -> None:
    models = [model("a", exec_s=1.0)]
    workers = [
        (worker_spec("fast", speed=2.0), [resident("a")]),
        (worker_spec("slow", speed=1.0), [resident("a")]),
    ]
    snap = snapshot(models, workers)
    busy_fast = PlacementSnapshot(
        now_s=snap.now_s,
        workers=(
            replace_utilization(snap.workers[0], 0.4),
            replace_utilization(snap.workers[1], 0.1),
        ),
        models=snap.models,
        pipelines=snap.pipelines,
        demand_rps=snap.demand_rps,
        waiting=snap.waiting,
    )
    # fast 0.5 s, slow 1.0 s: within 2 x 1 s of the best, the less busy slow worker wins;
    # with no slack it is least work, the fast one.
    assert BalancedWorkRouter().route("a", busy_fast, ctx()) == "slow"
    assert BalancedWorkRouter(slack=0.0).route("a", busy_fast, ctx()) == "fast"
    # A slow replica more than the slack behind (3 stages queued: 4 s) is not chosen.
    queued = snapshot(
        models,
        [
            (worker_spec("fast", speed=2.0), [resident("a")]),
            (worker_spec("slow", speed=1.0), [resident("a", queued=2, running=1)]),
        ],
    )
    assert BalancedWorkRouter().route("a", queued, ctx()) == "fast"
    with pytest.raises(ValueError, match="slack"):
        BalancedWorkRouter(slack=-1.0)


def replace_utilization(state: WorkerState, utilization: float) -> WorkerState:
    return dataclasses.replace(state, utilization=utilization)


def test_jsq_and_round_robin() -> None:
    snap = routing_snapshot()
    assert JoinShortestQueueRouter().route("a", snap, ctx()) == "w0"
    turns = [RoundRobinRouter().route("a", snap, ctx(s)) for s in range(4)]
    assert turns == ["w0", "w1", "w3", "w0"]


def test_routers_prefer_ready_holders_and_fall_back_to_loading_ones() -> None:
    models = [model("a")]
    loading_fast = snapshot(
        models,
        [
            (worker_spec("w0", speed=1.0), [resident("a", queued=2)]),
            (worker_spec("w1", speed=4.0), [resident("a", ready_at_s=101.0)]),
        ],
    )
    assert LeastWorkRouter().route("a", loading_fast, ctx()) == "w0"
    only_loading = snapshot(models, [(worker_spec("w1"), [resident("a", ready_at_s=103.0)])])
    assert LeastWorkRouter().route("a", only_loading, ctx()) == "w1"


# -- registry -------------------------------------------------------------------------


def test_registry_bundles_each_placement_with_its_router() -> None:
    routers = {name: type(make_multimodel_policy(name).router) for name in NAMES}
    assert routers == {
        "adaptive": BalancedWorkRouter,
        "adaptive-balanced": BalancedWorkRouter,
        "static-rr": RoundRobinRouter,
        "threshold": JoinShortestQueueRouter,
        "least-loaded": LeastWorkRouter,
        "gaps": GapsHybridRouter,
    }
    for name in NAMES:
        assert make_multimodel_policy(name).placement.name == name


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(
        UnknownMultiModelPolicyError,
        match="known policies are adaptive, adaptive-balanced, static-rr",
    ):
        make_multimodel_policy("grouped")
    assert issubclass(UnknownMultiModelPolicyError, ValueError)
