"""Grouped scheduling, data-oblivious (``grouped``) and data-aware (``grouped-da``,
``sneakpeek``).

The window's requests are grouped by application; the data-aware forms split each
application's group by SneakPeek's predicted label for confident requests (the label's
class frequency above :data:`~switchyard.selection.snapshot.CONFIDENT_THETA`), the
unconfident ones forming a sub-group of their own, as far as the exact search's bound
``tau`` allows (:func:`group_requests`): splitting past it used to send the data-aware
forms to the greedy order, which planned worse than the data-oblivious form's exact
one. A group runs as one batch with one variant (a group larger than every profiled
batch size stays one planned unit; :func:`~switchyard.selection.base.batch_latency_s`
prices it as consecutive batches).

Search. With at most ``tau`` groups (default 5) every order of the groups is tried; along
an order each group in turn takes the variant that maximises the group's summed expected
utility given when it would start (a swap included), on the worker where that variant
would finish earliest (list scheduling). The order with the highest total wins (ties:
the first the search reaches). The search is therefore exact over orders and greedy
over variants within an order. It is a depth-first walk over order prefixes (orders
sharing a prefix share its work) with a bound: a prefix is dropped when its utility
plus the most each remaining group could still earn cannot reach the best order found
so far, the groups' earliest-deadline order to begin with, which never changes the
answer (up to 1e-12 of utility). That most is, at first, what the group earned as its
parent's best choice; a node replaces those ceilings one by one with each group's best
choice from its own state and stops as soon as the sum falls short, without computing
the rest. From each prefix it tries first the group that earns the most per second of
the worker it takes (Smith's rule), so good orders come early and cut more: on ``make
bench-selection``'s windows it evaluates 30 % fewer group choices at the median and 40 %
fewer at the 99th percentile than trying the groups in index order.
With more than ``tau`` groups, greedy: groups in descending mean
:func:`~switchyard.selection.base.priority`, each with its best variant.

Short-circuit (``sneakpeek`` only). SneakPeek's own label is a zero-latency candidate: a
request answered with it at ``now_s`` earns ``penalty.utility(max(theta), now_s -
deadline_s)``, its *floor*. The search values each request at the better of its batch's
answer and its floor, so it orders the groups knowing which requests the label can
answer; in the plan it finds, a request whose floor beats its batch's answer is
short-circuited and leaves the batch (which then finishes no later, so no other request
loses). One search a window: an earlier form searched the whole window, short-circuited,
then searched the rest again, at twice the decision time (docs/benchmarks.md compares
the two).
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
    confident_label: dict[str, int | None] = {}
    for request in requests:
        by_app.setdefault(request.app, []).append(request)
        confident_label[request.request_id] = request.confident_label
    # Per application, the labels it is split by: every one of a set, one, or none.
    labels_by_app: dict[str, int | frozenset[int] | None] = dict.fromkeys(by_app)
    if split_by_label:
        budget = None if max_groups is None else max_groups - len(by_app)
        for app in sorted(by_app, key=lambda a: -len(by_app[a])):
            counts: dict[int, int] = {}
            unconfident = False
            for request in by_app[app]:
                predicted = confident_label[request.request_id]
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
        own = confident_label[request.request_id]
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
        floors: list[float] | None = None,
    ) -> None:
        self.variant = variant
        self.key_id = key_id
        self.load_s = variant.load_s
        self.accs = accs  # in the group's deadline order
        on_time = accs if floors is None else [max(a, f) for a, f in zip(accs, floors, strict=True)]
        self.prefix = [0.0]
        for a in on_time:
            self.prefix.append(self.prefix[-1] + a)
        self.total = self.prefix[-1]
        self.lanes = lanes  # (worker index, batch time for the group's size)
        # end_s -> the group's utility: orders sharing the same predecessors (in any
        # order) end the group at the same time
        self.memo: dict[float, float] = {}


class _Group:
    __slots__ = (
        "app",
        "choices",
        "deadlines",
        "floors",
        "late_factor",
        "late_floors",
        "late_total",
        "requests",
        "step",
        "unpacked",
    )

    def __init__(
        self,
        app: AppView,
        requests: list[WindowRequest],
        choices: list[_Choice],
        floors: list[float] | None = None,
    ):
        self.app = app
        self.requests = requests  # by deadline
        self.deadlines = [r.deadline_s for r in requests]
        self.choices = choices
        # what _best_choice reads of each choice, unpacked once: it runs at every node
        self.unpacked = tuple(
            (ci, c, c.key_id, c.load_s, c.lanes, c.memo) for ci, c in enumerate(choices)
        )
        self.floors = floors  # each request's short-circuit utility, None: no short-circuit
        self.step = app.penalty.kind == "step"
        self.late_floors = [0.0] * len(requests) if floors is None else floors
        self.late_total = app.penalty.late_total()
        self.late_factor = app.penalty.late_factor()

    def utility(self, choice: _Choice, end_s: float) -> float:
        """Summed expected utility of the group answered by ``choice`` at ``end_s`` (each
        request at least its floor, when the group has floors)."""
        value = choice.memo.get(end_s)
        if value is not None:
            return value
        late = bisect_left(self.deadlines, end_s)  # deadlines before end_s are missed
        value = choice.total - choice.prefix[late]
        if late and (self.floors is not None or not self.step):
            value += self.late_total(choice.accs, self.late_floors, self.deadlines, late, end_s)
        choice.memo[end_s] = value
        return value

    def short_circuited(self, choice: _Choice, end_s: float) -> list[bool]:
        """Which requests the label answers better than ``choice``'s batch ending at
        ``end_s`` (none without floors)."""
        if self.floors is None:
            return [False] * len(self.requests)
        factor = self.late_factor
        return [
            floor > (acc if end_s <= deadline else acc * factor(end_s - deadline))
            for acc, floor, deadline in zip(choice.accs, self.floors, self.deadlines, strict=True)
        ]


Step = tuple[int, int, int]
"""(group index, choice index, worker index) in plan order."""


def _best_choice(
    group: _Group, free: list[float], loaded: list[int]
) -> tuple[int, int, float, float]:
    """The group's best variant given the workers' state: (choice, worker, end, utility).
    Ties: the earlier end, then the first listed variant."""
    best_c, best_lane, best_end, best_u = -1, -1, math.inf, -1.0
    utility = group.utility
    for ci, choice, key, load, lanes, memo in group.unpacked:
        if len(lanes) == 1:
            lane, run_s = lanes[0]
            end = free[lane] + run_s if loaded[lane] == key else free[lane] + load + run_s
        else:
            end, lane = math.inf, -1
            for li, run_s in lanes:
                e = free[li] + run_s if loaded[li] == key else free[li] + load + run_s
                if e < end:
                    end, lane = e, li
        u = memo.get(end)  # the memo's lookup inlined: a third of calls hit
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


def _exact(groups: list[_Group], free: list[float], loaded: list[int]) -> list[Step]:
    """The best order of ``groups`` (see the module docstring)."""
    n = len(groups)
    # the most each group can earn: on time with its most accurate variant
    bounds = [max(c.total for c in g.choices) for g in groups]
    apps = [g.app.name for g in groups]
    unique_apps = len(set(apps)) == n  # then no group's bound needs _optimistic
    used = [False] * n
    path: list[Step] = []
    # Start from the deadline order, a little below its value: a branch that cannot reach
    # it is cut at once, and the first order the search reaches with the best value is
    # still the one kept, as without it.
    by_deadline = sorted(range(n), key=lambda i: (groups[i].deadlines[0], i))
    seed_value, seed_path = _run_in_order(groups, free, loaded, by_deadline)
    best_value = seed_value - 2 * _EPS
    best_path: list[Step] = []

    def visit(depth: int, value: float, headroom: float, ceiling: list[float]) -> None:
        """``ceiling[gi]``: the most group ``gi`` can earn from here on (its bound in the
        parent's state, which only falls as the workers fill: see below)."""
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
        # The bound tightens as each group's own bound replaces its ceiling: stop as soon
        # as it cannot reach the best order, before computing the rest.
        reach = value
        for gi in left:
            reach += ceiling[gi]
        if reach <= best_value + _EPS:
            return
        picks = []
        below = ceiling.copy()
        for gi in left:
            pick = _best_choice(groups[gi], free, loaded)
            if unique_apps or sum(1 for gj in left if apps[gj] == apps[gi]) == 1:
                bound = pick[3]
            else:
                bound = _optimistic(groups[gi], free, loaded)
            bound = min(bound, ceiling[gi])  # both bound it; the ceiling may be tighter
            reach -= ceiling[gi] - bound
            if reach <= best_value + _EPS:
                return
            picks.append(pick)
            below[gi] = bound
        # The children by what they earn per second of the worker they take, the most
        # first (Smith's rule): a good order comes sooner, so more prefixes are cut.
        children = sorted(
            zip(left, picks, strict=True),
            key=lambda child: -child[1][3] / ((child[1][2] - free[child[1][1]]) or _EPS),
        )
        for gi, (ci, lane, end, u) in children:
            group = groups[gi]
            old_free, old_loaded = free[lane], loaded[lane]
            free[lane], loaded[lane] = end, group.choices[ci].key_id
            used[gi] = True
            path.append((gi, ci, lane))
            visit(depth + 1, value + u, headroom - bounds[gi], below)
            path.pop()
            used[gi] = False
            free[lane], loaded[lane] = old_free, old_loaded

    visit(0, 0.0, sum(bounds), bounds)
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
        return self._plan(snapshot, valid, accuracy).to_plan(rejected)

    def _plan(
        self, snapshot: WindowSnapshot, requests: Sequence[WindowRequest], accuracy: AccuracyFn
    ) -> ScoredPlan:
        """The window planned: the groups' order searched, then each group's batch (less
        the requests its label answers better) committed in that order."""
        groups = self._groups(snapshot, requests, accuracy)
        free = [max(snapshot.now_s, w.free_at_s) for w in snapshot.workers]
        key_ids: dict[tuple[str, str], int] = {}
        for g in groups:
            for c in g.choices:
                key_ids.setdefault((g.app.name, c.variant.name), c.key_id)
        loaded = [-1 if w.loaded is None else key_ids.get(w.loaded, -1) for w in snapshot.workers]
        if len(groups) <= self.tau:
            steps = _exact(groups, free, loaded)
        else:
            steps = _greedy(groups, free, loaded, snapshot.now_s)
        timeline = Timeline(snapshot, accuracy)
        short: list[WindowRequest] = []
        for gi, ci, lane in steps:
            group = groups[gi]
            choice = group.choices[ci]
            batch = group.requests
            if group.floors is not None:
                searched = timeline.option(group.app, choice.variant, len(batch), lane=lane)
                assert searched is not None  # the lane was one the variant runs on
                answered = group.short_circuited(choice, searched.end_s)
                short.extend(r for r, s in zip(batch, answered, strict=True) if s)
                batch = [r for r, s in zip(batch, answered, strict=True) if not s]
                if not batch:
                    continue
            option = timeline.option(group.app, choice.variant, len(batch), lane=lane)
            assert option is not None
            timeline.commit(option, group.app, choice.variant, batch)
        for request in short:
            timeline.short_circuit(request)
        return timeline.result()

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
            floors = None
            if self.short_circuit:
                floors = [short_circuit_utility(r, app, snapshot.now_s) or 0.0 for r in members]
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
                choices.append(_Choice(variant, key_id, accs, lanes, floors))
            groups.append(_Group(app, members, choices, floors))
        return groups
