"""Grouped scheduling, data-oblivious (``grouped``) and data-aware (``grouped-da``,
``sneakpeek``).

The window's requests are grouped by application; the data-aware forms split each
application's group by SneakPeek's predicted label for confident requests (the label's
class frequency above :data:`~switchyard.selection.snapshot.CONFIDENT_THETA`), the
unconfident ones forming a sub-group of their own, as far as the exact search's bound
``tau`` allows (:func:`group_requests`): splitting past it used to send the data-aware
forms to the greedy order, which planned worse than the data-oblivious form's exact one. A group runs as one batch with one
variant (a group larger than every profiled batch size stays one planned unit;
:func:`~switchyard.selection.base.batch_latency_s` prices it as consecutive batches).

Search. With at most ``tau`` groups (default 5) every order of the groups is tried; along
an order each group in turn takes the variant that maximises the group's summed expected
utility given when it would start (a swap included), on the worker where that variant
would finish earliest (list scheduling). The order with the highest total wins (ties:
the first order in lexicographic order of group positions). The search is therefore
exact over orders and greedy over variants within an order. It is a depth-first walk
over order prefixes (orders sharing a prefix share its work) with a bound: a prefix is
dropped when its utility plus the best each remaining group could earn on time cannot
reach the best order found so far, the groups' earliest-deadline order to begin with,
which never changes the answer (up to 1e-12 of utility).
With more than ``tau`` groups, greedy: groups in descending mean
:func:`~switchyard.selection.base.priority`, each with its best variant.

Short-circuit (``sneakpeek`` only). SneakPeek's own label is a zero-latency candidate: a
request answered with it at ``now_s`` earns ``penalty.utility(max(theta), now_s -
deadline_s)``. The scheduler first plans the whole window, then short-circuits every
request whose short-circuit utility exceeds what it earns in that plan, then plans the
remaining requests once more (regrouped). It does not iterate further.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.policies.base import DecisionContext
from switchyard.selection.base import WindowPlan, batch_latency_s, priority
from switchyard.selection.snapshot import AppView, VariantView, WindowRequest, WindowSnapshot
from switchyard.selection.timeline import (
    AccuracyFn,
    ScoredPlan,
    Timeline,
    estimated_accuracy,
    profiled_accuracy,
    runs_on,
    short_circuit_utility,
    validate_requests,
    without_estimates,
)

__all__ = ["DEFAULT_TAU", "GroupedScheduler", "group_requests"]

DEFAULT_TAU = 5
"""Most groups whose every order is searched (the paper solves 5 in under 10 ms)."""

_EPS = 1e-12

GroupKey = tuple[str, int | None]
"""(application, SneakPeek label or ``None``: not split / not confident)."""


def group_requests(
    requests: Sequence[WindowRequest], *, split_by_label: bool, max_groups: int | None = None
) -> dict[GroupKey, list[WindowRequest]]:
    """Group by application and, with ``split_by_label``, by SneakPeek's label for
    confident requests (unconfident ones share the ``None`` label). Groups come in the
    order of their first request; requests keep their order within a group.

    ``max_groups`` bounds the splits (the exact search's ``tau``): applications are
    split in turn, the largest group first, each by every label while the total stays
    within the bound; one whose full split would pass it splits off only its most
    frequent confident label (the rest share ``None``) if that fits, else stays whole.
    Without a bound every application is split by every label."""
    by_app: dict[str, list[WindowRequest]] = {}
    for request in requests:
        by_app.setdefault(request.app, []).append(request)
    # Per application, the labels it is split by: every one of a set, one, or none.
    labels_by_app: dict[str, int | frozenset[int] | None] = dict.fromkeys(by_app)
    if split_by_label:
        budget = None if max_groups is None else max_groups - len(by_app)
        for app in sorted(by_app, key=lambda a: -len(by_app[a])):
            counts: dict[int, int] = {}
            unconfident = False
            for request in by_app[app]:
                predicted = request.predicted_label if request.confident else None
                if predicted is None:
                    unconfident = True
                else:
                    counts[predicted] = counts.get(predicted, 0) + 1
            extra = len(counts) + unconfident - 1
            if extra <= 0:
                continue
            if budget is None or extra <= budget:
                labels_by_app[app] = frozenset(counts)
                budget = None if budget is None else budget - extra
            elif budget >= 1:
                labels_by_app[app] = max(counts, key=lambda label: counts[label])
                budget -= 1
    groups: dict[GroupKey, list[WindowRequest]] = {}
    for request in requests:
        split = labels_by_app[request.app]
        own = request.predicted_label if request.confident else None
        kept = own is not None and (own in split if isinstance(split, frozenset) else own == split)
        groups.setdefault((request.app, own if kept else None), []).append(request)
    return groups


class _Choice:
    """One variant for one group: the arrays the search reads, built once per window."""

    __slots__ = ("accs", "key_id", "lanes", "load_s", "memo", "prefix", "total", "variant")

    def __init__(
        self,
        variant: VariantView,
        key_id: int,
        accs: list[float],
        lanes: list[tuple[int, float]],
    ) -> None:
        self.variant = variant
        self.key_id = key_id
        self.load_s = variant.load_s
        self.accs = accs  # in the group's deadline order
        self.prefix = [0.0]
        for a in accs:
            self.prefix.append(self.prefix[-1] + a)
        self.total = self.prefix[-1]
        self.lanes = lanes  # (worker index, batch time for the group's size)
        # end_s -> the group's utility: orders sharing the same predecessors (in any
        # order) end the group at the same time
        self.memo: dict[float, float] = {}


class _Group:
    __slots__ = ("app", "choices", "deadlines", "late_total", "requests", "step")

    def __init__(self, app: AppView, requests: list[WindowRequest], choices: list[_Choice]):
        self.app = app
        self.requests = requests  # by deadline
        self.deadlines = [r.deadline_s for r in requests]
        self.choices = choices
        self.step = app.penalty.kind == "step"
        self.late_total = app.penalty.late_total()

    def utility(self, choice: _Choice, end_s: float) -> float:
        """Summed expected utility of the group answered by ``choice`` at ``end_s``."""
        value = choice.memo.get(end_s)
        if value is not None:
            return value
        late = bisect_left(self.deadlines, end_s)  # deadlines before end_s are missed
        value = choice.total - choice.prefix[late]
        if late and not self.step:
            value += self.late_total(choice.accs, self.deadlines, late, end_s)
        choice.memo[end_s] = value
        return value


Step = tuple[int, int, int]
"""(group index, choice index, worker index) in plan order."""


def _best_choice(
    group: _Group, free: list[float], loaded: list[int]
) -> tuple[int, int, float, float]:
    """The group's best variant given the workers' state: (choice, worker, end, utility).
    Ties: the earlier end, then the first listed variant."""
    best_c, best_lane, best_end, best_u = -1, -1, math.inf, -1.0
    utility = group.utility
    for ci, choice in enumerate(group.choices):
        key, load = choice.key_id, choice.load_s
        lanes = choice.lanes
        if len(lanes) == 1:
            lane, run_s = lanes[0]
            end = free[lane] + run_s if loaded[lane] == key else free[lane] + load + run_s
        else:
            end, lane = math.inf, -1
            for li, run_s in lanes:
                e = free[li] + run_s if loaded[li] == key else free[li] + load + run_s
                if e < end:
                    end, lane = e, li
        u = choice.memo.get(end)  # the memo's lookup inlined: a third of calls hit
        if u is None:
            u = utility(choice, end)
        if u > best_u or (u == best_u and end < best_end):
            best_c, best_lane, best_end, best_u = ci, lane, end, u
    return best_c, best_lane, best_end, best_u


def _optimistic(group: _Group, free: list[float], loaded: list[int]) -> float:
    """The most a group can still earn from this state when a group of its application
    left could load its variant first: each variant ending as early as it could, started
    at once on its fastest lane without a swap-in. Utility only falls as the end moves
    later, so no order placing the group later earns more."""
    best = 0.0
    utility = group.utility
    for choice in group.choices:
        end = min(free[li] + run_s for li, run_s in choice.lanes)
        u = utility(choice, end)
        if u > best:
            best = u
    return best


def _run_in_order(
    groups: list[_Group], free: list[float], loaded: list[int], order: Sequence[int]
) -> tuple[float, list[Step]]:
    """The groups run in ``order``, each with its best variant: a candidate first
    incumbent of the search (its value and path)."""
    free, loaded = list(free), list(loaded)
    value = 0.0
    path: list[Step] = []
    for gi in order:
        group = groups[gi]
        ci, lane, end, u = _best_choice(group, free, loaded)
        free[lane], loaded[lane] = end, group.choices[ci].key_id
        value += u
        path.append((gi, ci, lane))
    return value, path


def _exact(
    groups: list[_Group], free: list[float], loaded: list[int], prior: Sequence[str] = ()
) -> list[Step]:
    """The best order of ``groups`` (see the module docstring); ``prior``: applications in
    the order an earlier plan of the window ran them, a likely good first incumbent."""
    n = len(groups)
    # the most each group can earn: on time with its most accurate variant
    bounds = [max(c.total for c in g.choices) for g in groups]
    apps = [g.app.name for g in groups]
    unique_apps = len(set(apps)) == n  # then no group's bound needs _optimistic
    used = [False] * n
    path: list[Step] = []
    # Start from the better of the deadline order and the prior order, a little below its
    # value: a branch that cannot reach it is cut at once, and the first order
    # (lexicographically) reaching the best value is still the one kept, as without it.
    by_deadline = sorted(range(n), key=lambda i: (groups[i].deadlines[0], i))
    seed_value, seed_path = _run_in_order(groups, free, loaded, by_deadline)
    if prior:
        rank = {app: r for r, app in enumerate(prior)}
        by_prior = sorted(by_deadline, key=lambda i: rank.get(apps[i], n))
        if by_prior != by_deadline:
            value, steps = _run_in_order(groups, free, loaded, by_prior)
            if value > seed_value:
                seed_value, seed_path = value, steps
    best_value = seed_value - 2 * _EPS
    best_path: list[Step] = []

    def visit(depth: int, value: float, headroom: float) -> None:
        nonlocal best_value, best_path
        if depth == n:
            if value > best_value:
                best_value, best_path = value, path.copy()
            return
        if value + headroom <= best_value + _EPS:
            return
        # Each remaining group's best choice from here, and a tighter bound from them: a
        # group with no other group of its application left can do no better later than
        # its best choice now (the same swap-in, a later start); one that has is bounded
        # without the swap-in (:func:`_optimistic`).
        left = [gi for gi in range(n) if not used[gi]]
        picks = [_best_choice(groups[gi], free, loaded) for gi in left]
        reach = value
        if unique_apps:
            for pick in picks:
                reach += pick[3]
        else:
            for gi, pick in zip(left, picks, strict=True):
                if sum(1 for gj in left if apps[gj] == apps[gi]) == 1:
                    reach += pick[3]
                else:
                    reach += _optimistic(groups[gi], free, loaded)
        if reach <= best_value + _EPS:
            return
        for gi, (ci, lane, end, u) in zip(left, picks, strict=True):
            group = groups[gi]
            old_free, old_loaded = free[lane], loaded[lane]
            free[lane], loaded[lane] = end, group.choices[ci].key_id
            used[gi] = True
            path.append((gi, ci, lane))
            visit(depth + 1, value + u, headroom - bounds[gi])
            path.pop()
            used[gi] = False
            free[lane], loaded[lane] = old_free, old_loaded

    visit(0, 0.0, sum(bounds))
    return best_path or seed_path


def _greedy(groups: list[_Group], free: list[float], loaded: list[int], now_s: float) -> list[Step]:
    def mean_priority(g: _Group) -> float:
        return sum(priority(r, g.app, now_s) for r in g.requests) / len(g.requests)

    keys = [(-mean_priority(g), i) for i, g in enumerate(groups)]
    steps: list[Step] = []
    for _, gi in sorted(keys):
        ci, lane, end, _u = _best_choice(groups[gi], free, loaded)
        free[lane], loaded[lane] = end, groups[gi].choices[ci].key_id
        steps.append((gi, ci, lane))
    return steps


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupedScheduler:
    """Grouped scheduling; see the module docstring.

    Args:
        name: the registry name.
        data_aware: believe SneakPeek's estimates and split groups by its label.
        short_circuit: also answer requests with SneakPeek's label (needs ``data_aware``).
        tau: most groups searched exactly (>= 0); more fall back to greedy.

    Example:
        >>> sneakpeek = GroupedScheduler(name="sneakpeek", data_aware=True, short_circuit=True)
    """

    name: str
    data_aware: bool
    short_circuit: bool = False
    tau: int = DEFAULT_TAU

    def __post_init__(self) -> None:
        if self.tau < 0:
            raise ValueError(f"tau: must be >= 0, got {self.tau!r}")
        if self.short_circuit and not self.data_aware:
            raise ValueError("short_circuit: needs data_aware (SneakPeek's estimates)")

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        """Plan the window. ``ctx`` is not used: the search is deterministic."""
        del ctx
        valid, rejected = validate_requests(snapshot, use_estimates=self.data_aware)
        accuracy = estimated_accuracy if self.data_aware else profiled_accuracy
        if not self.data_aware:
            valid = without_estimates(valid)
        scored, order = self._plan(snapshot, valid, accuracy, (), ())
        if self.short_circuit:
            short = []
            for request in valid:
                value = short_circuit_utility(request, snapshot.apps[request.app], snapshot.now_s)
                if value is not None and value > scored.utility_by_request[request.request_id]:
                    short.append(request)
            if short:
                chosen = {r.request_id for r in short}
                rest = [r for r in valid if r.request_id not in chosen]
                scored, _ = self._plan(snapshot, rest, accuracy, short, order)
        return scored.to_plan(rejected)

    def _plan(
        self,
        snapshot: WindowSnapshot,
        requests: Sequence[WindowRequest],
        accuracy: AccuracyFn,
        short: Sequence[WindowRequest],
        prior: Sequence[str],
    ) -> tuple[ScoredPlan, list[str]]:
        """The window planned without the ``short``-circuited requests, and the order its
        applications run in (``prior``: an earlier plan's, to start the search from)."""
        groups = self._groups(snapshot, requests, accuracy)
        free = [max(snapshot.now_s, w.free_at_s) for w in snapshot.workers]
        key_ids: dict[tuple[str, str], int] = {}
        for g in groups:
            for c in g.choices:
                key_ids.setdefault((g.app.name, c.variant.name), c.key_id)
        loaded = [-1 if w.loaded is None else key_ids.get(w.loaded, -1) for w in snapshot.workers]
        if len(groups) <= self.tau:
            steps = _exact(groups, free, loaded, prior)
        else:
            steps = _greedy(groups, free, loaded, snapshot.now_s)
        timeline = Timeline(snapshot, accuracy)
        for gi, ci, lane in steps:
            group = groups[gi]
            variant = group.choices[ci].variant
            option = timeline.option(group.app, variant, len(group.requests), lane=lane)
            assert option is not None  # the lane was one the variant runs on
            timeline.commit(option, group.app, variant, group.requests)
        for request in short:
            timeline.short_circuit(request)
        return timeline.result(), [groups[gi].app.name for gi, _, _ in steps]

    def _groups(
        self, snapshot: WindowSnapshot, requests: Sequence[WindowRequest], accuracy: AccuracyFn
    ) -> list[_Group]:
        types = [w.worker_type for w in snapshot.workers]
        key_ids: dict[tuple[str, str], int] = {}
        groups: list[_Group] = []
        for (app_name, _label), members in group_requests(
            requests, split_by_label=self.data_aware, max_groups=self.tau
        ).items():
            app = snapshot.apps[app_name]
            members = sorted(members, key=lambda r: r.deadline_s)
            size = len(members)
            choices: list[_Choice] = []
            for variant in app.variants:
                run_by_type: dict[str, float] = {}
                lanes: list[tuple[int, float]] = []
                for li, worker_type in enumerate(types):
                    if worker_type not in run_by_type:
                        if not runs_on(variant, worker_type):
                            continue
                        run_by_type[worker_type] = batch_latency_s(variant, worker_type, size)
                    lanes.append((li, run_by_type[worker_type]))
                if not lanes:
                    continue
                key_id = key_ids.setdefault((app.name, variant.name), len(key_ids))
                accs = [accuracy(r, variant) for r in members]
                choices.append(_Choice(variant, key_id, accs, lanes))
            groups.append(_Group(app, members, choices))
        return groups
