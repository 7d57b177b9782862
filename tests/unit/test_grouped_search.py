"""The grouped schedulers' exact search: its pruning never loses the best order.

The search (``selection/grouped.py``) walks the orders of a window's groups depth first
and drops a prefix whose bound cannot reach the best order found so far. Whatever it
prunes, the order it returns must be worth as much as the best of every order tried in
full, each group taking its best variant in turn: checked here on random windows
against that enumeration, with one and two workers, swap costs, both penalty shapes,
and SneakPeek's short-circuit floors.
"""

from __future__ import annotations

import itertools
import random

import pytest
from switchyard.apps.penalty import Penalty
from switchyard.selection.grouped import GroupedScheduler, _exact, _run_in_order
from switchyard.selection.snapshot import (
    AppView,
    VariantView,
    WindowRequest,
    WindowSnapshot,
    WorkerSlot,
)
from switchyard.selection.timeline import estimated_accuracy, validate_requests

PENALTIES = {
    "step": Penalty(kind="step"),
    "sigmoid": Penalty(kind="sigmoid", steepness_per_s=100.0, midpoint_s=0.05),
}
VARIANTS = (
    ("small", 0.80, 0.002, 0.005),
    ("medium", 0.90, 0.006, 0.02),
    ("large", 0.97, 0.02, 0.06),
)
"""(name, accuracy, batch-of-one seconds, load seconds): three speeds, swaps that count."""


def _app(name: str, penalty: Penalty, rng: random.Random) -> AppView:
    variants = tuple(
        VariantView(
            name=variant,
            latency_s={"cpu": {1: run_s, 8: run_s * 1.5, 32: run_s * 3}},
            load_s=load_s * rng.uniform(0.5, 1.5),
            accuracy=accuracy,
            recall=(accuracy, accuracy * 0.95, min(1.0, accuracy * 1.02)),
        )
        for variant, accuracy, run_s, load_s in VARIANTS
    )
    return AppView(name=name, num_classes=3, penalty=penalty, variants=variants)


def _window(rng: random.Random, penalty: Penalty, workers: int) -> WindowSnapshot:
    apps = [_app(f"app{a}", penalty, rng) for a in range(rng.randint(3, 5))]
    requests = []
    for i in range(rng.randint(6, 24)):
        theta = [rng.random() for _ in range(3)]
        total = sum(theta)
        requests.append(
            WindowRequest(
                request_id=f"r{i}",
                app=rng.choice(apps).name,
                arrival_s=0.0,
                deadline_s=rng.uniform(0.02, 0.15),
                theta=tuple(t / total for t in theta),
            )
        )
    loaded = (apps[0].name, "medium")
    return WindowSnapshot(
        now_s=0.0,
        requests=tuple(requests),
        apps={a.name: a for a in apps},
        workers=tuple(
            WorkerSlot(
                worker_id=f"w{w}",
                worker_type="cpu",
                free_at_s=rng.uniform(0.0, 0.01),
                loaded=loaded if w == 0 else None,
            )
            for w in range(workers)
        ),
    )


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("penalty", sorted(PENALTIES))
@pytest.mark.parametrize("name", ["grouped", "grouped-da", "sneakpeek"])
def test_the_search_returns_an_order_as_good_as_the_best_of_every_order(
    name: str, penalty: str, workers: int
) -> None:
    scheduler = GroupedScheduler(
        name=name, data_aware=name != "grouped", short_circuit=name == "sneakpeek"
    )
    rng = random.Random(f"{name}-{penalty}-{workers}")
    searched = 0
    for _ in range(40):
        snapshot = _window(rng, PENALTIES[penalty], workers)
        valid, _ = validate_requests(snapshot, use_estimates=True)
        groups = scheduler._groups(snapshot, valid, estimated_accuracy)
        if not 2 <= len(groups) <= scheduler.tau:
            continue
        free = [max(snapshot.now_s, w.free_at_s) for w in snapshot.workers]
        keys = {(g.app.name, c.variant.name): c.key_id for g in groups for c in g.choices}
        loaded = [-1 if w.loaded is None else keys.get(w.loaded, -1) for w in snapshot.workers]
        steps = _exact(groups, free, loaded)
        found, _ = _run_in_order(groups, free, loaded, [gi for gi, _, _ in steps])
        best = max(
            _run_in_order(groups, free, loaded, order)[0]
            for order in itertools.permutations(range(len(groups)))
        )
        assert sorted(gi for gi, _, _ in steps) == list(range(len(groups)))
        assert found == pytest.approx(best, abs=1e-9)
        searched += 1
    assert searched >= 20  # most windows have several groups within the bound
