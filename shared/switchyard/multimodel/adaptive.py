"""The adaptive policy: greedy minimisation of ``alpha*D + beta*U + gamma*CoV(L)``.

State and decision. The snapshot is ``s_t = [m_t, r_t, q_t]``: where every model is
resident or loading, each worker's free resources, and the queues. The decision is the
joint placement (which models are resident where; a replica's resources are its
allocation) that minimises the running cost

    cost = alpha * D + beta * U + gamma * CoV(L)

Delay ``D`` (stage-seconds per second; by Little's law, the mean number of stages in
the system). Per model ``m`` with effective demand ``lam = demand_rps + backlog /
horizon_s`` (the queue present now must also be served within the horizon), mean
service ``e = exec_s`` at speed 1, and replicas ``r`` on workers of speed ``v_r``, each
counted with its availability ``a_r = H / (H + t_r)`` where ``t_r`` is the seconds until
it is ready (0 for a ready replica, ``load_s`` for one this plan loads; ``H =
horizon_s``), so loading time discounts what a replica contributes:

- capacity ``mu = sum(a_r * v_r) / e`` stages per second, ``c = sum(a_r)`` servers,
  ``rho = lam / mu``;
- service: a router that balances work sends a replica stages in proportion to its
  rate, so the mean service time is ``c / mu`` (``e / v`` on identical workers);
- queueing: the M/M/c queue length by Sakasegawa's approximation, ``Lq = rho **
  sqrt(2 * (c + 1)) / (1 - rho)`` (exact for c = 1); beyond ``rho_cap`` (0.95) it goes on
  linearly with the fluid backlog ``(lam - rho_cap * mu) * H / 2`` so that overload is
  finite, continuous and still worth reducing;
- ``D_m = lam * c / mu + Lq``; a model with demand and no replica costs
  ``lam * (e + unplaced_penalty_s)`` (300 s: a stage that can run nowhere is priced as
  five minutes of waiting, so even a rarely used model with one request waiting wins a
  replica; at 30 s the long tail of the LoRA mix's 87 models starved, P99 1,000 s).

``D = sum_m D_m`` -- weighted by demand by construction.

Resource cost ``U``: the dominant shares held, ``sum over replicas of
share_of(model resources, worker capacity)``, i.e. how many workers' worth of resources
the placement holds (loading replicas included). With ``beta`` in stages per worker,
holding a whole worker is worth ``beta`` stages waiting.

Load balance ``CoV(L)``: the coefficient of variation over workers of ``L_w``, each
worker's predicted busy share (for every model on it, that model's utilisation times the
share of the worker its replica takes). Without it the delay term sends all work to the
fastest workers and leaves slow ones idle (a load CoV near 1 in the evaluation); the
term spreads the replicas of a hot model over fast and slow workers so that each
worker's busy share is alike (a fast worker then serves more of it). The registry's
``adaptive`` is the paper's cost (``gamma = 0``); ``adaptive-balanced`` adds the term.
Both route with ``balanced-work`` (:mod:`switchyard.multimodel.routing`): least
predicted work within a slack of two service times, then the least busy worker, which
is the router the busy-share model above assumes.

Defaults: ``alpha = 1``, ``beta = 2``, ``gamma = 20``, ``H = 60 s``, hysteresis 0.5,
minimum residency 120 s. The hysteresis and the residency keep the placement stable (with
0.05 and 5 s it followed every wobble of the demand estimate); a horizon and residency
shorter than the stages and loads of the Alibaba LoRA mix (10 s and 30 s, before) priced
loading replicas at half their worth and evicted replicas between bursts, and queues grew
at 5 % utilisation (docs/benchmarks.md, "Multi-model placement", has both histories). Worked number
(``H = 10 s``, hysteresis aside): a 1 s model at 0.6
rps on one ready speed-1 replica is an M/M/1 queue: ``D_m = 0.6 * 1 + 0.6**2 / 0.4 =
1.5``. A second ready replica on a speed-1 worker (dominant share 0.25) gives ``rho =
0.3, c = 2``: ``Lq = 0.3**sqrt(6) / 0.7 = 0.075``, ``D_m = 0.675``; the delay falls by
0.825 and ``U`` rises by 0.25 (x beta = 0.5), so the load pays (net -0.325). Loading it
takes 2 s: ``a = 10 / 12``, ``c = mu = 1.833``, ``rho = 0.327``, ``D_m = 0.704``, net
-0.296: still worth it. At 0.3 rps the same replica gains only 0.12 < 0.5: not added.
With the hysteresis of 0.5 the gain must exceed 1.0 for a quarter-worker replica, so
a second one is added once the first is about 64 % busy (at 0.64 rps: ``D_m`` 1.778
alone, 0.765 with the loading second replica).

Search. From the current placement, repeat: evaluate every single action -- load a
replica (on each kind of worker: speed and capacity; within a kind the least-loaded
worker that fits), evict one, move one to another kind of worker, or, for a model with
demand and no replica that fits nowhere, replace one resident by it -- and apply the one
with the largest cost reduction, while it fits (each worker's residents within its
capacity) and up to ``max_actions`` actions per update (loads of a model with no replica
at all are not counted: they are never churn). Cost is a sum over models plus a sum over
replicas, so an action only changes its own model's terms and the search caches the
rest. The balance term couples every model (an action moves the busy shares on its
model's holders, so every other model's balance change moves too); it is scored
incrementally -- ``CoV(L)`` from the running sum and sum of squares of ``L``, so a
candidate costs O(its holders), not O(workers) -- and lazily: out-of-date candidates are
re-scored only when they reach the top of the heap, and the search ends only after a
pass that re-scores every model against the final state finds nothing (see
:meth:`_Search.run`). At 64 workers and 100 models that took a decision from about
0.5 s to under 10 ms. Hysteresis, so that it does not thrash: an action must reduce the cost by more
than ``hysteresis`` (twice that for a move or a replace), a replica younger than
``min_residency_s`` (from the start of its load) or still loading is never evicted or
moved, and the search resumes from exactly the state its own plan leads to (the same
snapshot after the plan gives no further change). Ties go to the less loaded worker
(predicted busy share), then the first listed, so equal workers fill evenly.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from switchyard.multimodel.adaptive_cost import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_GAMMA,
    AdaptiveConfig,
    availability,
    model_delay,
)
from switchyard.multimodel.planning import (
    WorkingPlacement,
    dominant_share,
    effective_demand_rps,
    triple,
)
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot
from switchyard.policies.base import DecisionContext

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "DEFAULT_GAMMA",
    "AdaptiveConfig",
    "AdaptivePlacement",
    "model_delay",
    "placement_cost",
]


@dataclass(slots=True)
class _Candidate:
    score: float
    """Cost change plus the action's hysteresis (applied when negative)."""
    delta: float
    kind: int
    """0 load, 1 evict, 2 move, 3 replace: the order among equal scores."""
    model: str
    source: int
    """Worker losing a replica (evict, move) or -1."""
    target_class: int
    """Kind of worker gaining a replica (load, move) or -1."""
    victim: str = ""
    """Replace: the resident evicted to make room on ``source``."""


class _Search:
    """One update's greedy search (the module docstring has the model)."""

    def __init__(self, snapshot: PlacementSnapshot, cfg: AdaptiveConfig) -> None:
        self.cfg = cfg
        self.snapshot = snapshot
        self.work = WorkingPlacement(snapshot)
        self.rates = effective_demand_rps(snapshot, cfg.horizon_s)
        workers = snapshot.workers
        self.speeds = [max(0.0, w.spec.speed) for w in workers]
        self.util = [w.utilization for w in workers]
        classes: dict[tuple[float, tuple[float, float, float]], int] = {}
        self.class_of: list[int] = []
        self.members: list[list[int]] = []
        self.class_speed: list[float] = []
        self.class_capacity: list[tuple[float, float, float]] = []
        for index, worker in enumerate(workers):
            key = (self.speeds[index], triple(worker.spec.capacity))
            if key not in classes:
                classes[key] = len(self.members)
                self.members.append([])
                self.class_speed.append(key[0])
                self.class_capacity.append(key[1])
            self.class_of.append(classes[key])
            self.members[classes[key]].append(index)
        self.order = {name: i for i, name in enumerate(snapshot.models)}
        self._share: dict[tuple[str, int], float] = {}
        # Availability-weighted speed and server sums per model.
        self.speed_sum: dict[str, float] = {}
        self.servers: dict[str, float] = {}
        self.avail: dict[tuple[int, str], float] = {}
        for index, worker in enumerate(workers):
            for resident in worker.resident:
                a = availability(resident.ready_at_s - snapshot.now_s, cfg.horizon_s)
                self.avail[(index, resident.model)] = a
                self.speed_sum[resident.model] = (
                    self.speed_sum.get(resident.model, 0.0) + a * self.speeds[index]
                )
                self.servers[resident.model] = self.servers.get(resident.model, 0.0) + a
        self.delay = {
            m: self._delay(m, self.speed_sum.get(m, 0.0), self.servers.get(m, 0.0))
            for m in snapshot.models
        }
        self.load = [0.0] * len(workers)
        for index in range(len(workers)):
            for model in self.work.models_on(index):
                self.load[index] += self._busy_share(model, index)
        self.balance = cfg.gamma > 0.0
        # Sum and sum of squares of the busy shares, so that a candidate's change of
        # CoV(L) costs O(its holders), not O(workers); recomputed after every action.
        self.load_sum = 0.0
        self.load_sq = 0.0
        self.load_cov = 0.0
        self._resum()
        # Per kind of worker, its members by (predicted busy share, utilisation, index):
        # built on demand, dropped after every action.
        self._member_order: dict[int, list[int]] = {}

    # -- model --------------------------------------------------------------------

    def share(self, model: str, cls: int) -> float:
        key = (model, cls)
        value = self._share.get(key)
        if value is None:
            value = dominant_share(self.work.demand(model), self.class_capacity[cls])
            self._share[key] = value
        return value

    def _delay(self, model: str, speed_sum: float, servers: float) -> float:
        spec = self.snapshot.models.get(model)
        if spec is None:
            return 0.0
        return model_delay(self.rates.get(model, 0.0), spec.exec_s, speed_sum, servers, self.cfg)

    def _rho(self, model: str, speed_sum: float) -> float:
        """Busy fraction of each replica of ``model`` (a balancing router gives every
        replica the same utilisation) at availability-weighted speed sum ``speed_sum``."""
        spec = self.snapshot.models.get(model)
        if spec is None or speed_sum <= 0.0:
            return 0.0
        return min(1.0, self.rates.get(model, 0.0) * spec.exec_s / speed_sum)

    def _busy_share(self, model: str, index: int) -> float:
        rho = self._rho(model, self.speed_sum.get(model, 0.0))
        return rho * self.share(model, self.class_of[index])

    def _cov(self, total: float, squares: float) -> float:
        """CoV (population std / mean) of the busy shares from their sum and sum of
        squares; 0 when the mean is 0, as :func:`switchyard.stats.coefficient_of_variation`."""
        n = len(self.load)
        if n == 0:
            return 0.0
        mean = total / n
        if mean <= 1e-12:
            return 0.0
        return math.sqrt(max(0.0, squares / n - mean * mean)) / mean

    def _resum(self) -> None:
        self.load_sum = math.fsum(self.load)
        self.load_sq = math.fsum(x * x for x in self.load)
        self.load_cov = self._cov(self.load_sum, self.load_sq)

    def _balance_delta(self, model: str, new_speed_sum: float, drop: int, add: int) -> float:
        """Change of ``gamma * CoV(L)`` when ``model`` loses its replica on ``drop`` and
        gains one on ``add`` (-1: none) and its speed sum becomes ``new_speed_sum``:
        every holder's busy share moves with the model's utilisation. Only the holders'
        and ``add``'s terms of the sums change (delta scoring, O(holders))."""
        if not self.balance:
            return 0.0
        rho0 = self._rho(model, self.speed_sum.get(model, 0.0))
        rho1 = self._rho(model, new_speed_sum)
        total, squares = self.load_sum, self.load_sq
        for index in self.work.holders.get(model, ()):
            share = self.share(model, self.class_of[index])
            old = self.load[index]
            new = old + (0.0 if index == drop else rho1 * share) - rho0 * share
            total += new - old
            squares += new * new - old * old
        if add >= 0:
            old = self.load[add]
            new = old + rho1 * self.share(model, self.class_of[add])
            total += new - old
            squares += new * new - old * old
        return self.cfg.gamma * (self._cov(total, squares) - self.load_cov)

    def cost(self) -> float:
        u = 0.0
        for index in range(len(self.speeds)):
            for model in self.work.models_on(index):
                u += self.share(model, self.class_of[index])
        balance = self.cfg.gamma * self.load_cov
        return self.cfg.alpha * sum(self.delay.values()) + self.cfg.beta * u + balance

    def _new_avail(self, model: str) -> float:
        spec = self.snapshot.models[model]
        return availability(spec.load_s, self.cfg.horizon_s)

    def _evictable(self, index: int, model: str) -> bool:
        return (
            self.work.is_ready(index, model)
            and self.work.age_s(index, model) >= self.cfg.min_residency_s
        )

    # -- candidates ---------------------------------------------------------------

    def _candidates(self, model: str) -> list[_Candidate]:
        """Every improving action on ``model`` (by cost alone; feasibility of loads and
        moves on a kind of worker is checked when one is chosen)."""
        cfg = self.cfg
        found: list[_Candidate] = []
        if model not in self.snapshot.models:
            return found
        rate = self.rates.get(model, 0.0)
        s0 = self.speed_sum.get(model, 0.0)
        c0 = self.servers.get(model, 0.0)
        d0 = self.delay[model]
        a_new = self._new_avail(model)
        if rate > 0.0:
            for cls, speed in enumerate(self.class_speed):
                share = self.share(model, cls)
                if not math.isfinite(share) or share > 1.0 + 1e-9:
                    continue
                delta = cfg.alpha * (self._delay(model, s0 + a_new * speed, c0 + a_new) - d0)
                delta += cfg.beta * share
                if self.balance:
                    target = self._pick_member(model, cls, -1)
                    if target is None:
                        continue
                    # A model's first replica is never vetoed by the balance term: on
                    # idle workers one replica of a trickle of demand moves the load CoV
                    # from 0 to its maximum (CoV ignores how small the loads are), which
                    # would leave its stages waiting for good.
                    if c0 > 0.0:
                        delta += self._balance_delta(model, s0 + a_new * speed, -1, target)
                if delta + cfg.hysteresis < 0.0:
                    found.append(_Candidate(delta + cfg.hysteresis, delta, 0, model, -1, cls))
        for index in list(self.work.holders.get(model, ())):
            if not self._evictable(index, model):
                continue
            a_old = self.avail.get((index, model), 1.0)
            v_old = self.speeds[index]
            share_old = self.share(model, self.class_of[index])
            s1 = s0 - a_old * v_old
            c1 = c0 - a_old
            if c1 <= 1e-12:
                s1 = c1 = 0.0
            d1 = self._delay(model, s1, c1)
            delta = cfg.alpha * (d1 - d0) - cfg.beta * share_old
            delta += self._balance_delta(model, s1, index, -1)
            if delta + cfg.hysteresis < 0.0:
                found.append(_Candidate(delta + cfg.hysteresis, delta, 1, model, index, -1))
            if rate <= 0.0:
                continue
            for cls, speed in enumerate(self.class_speed):
                share = self.share(model, cls)
                if not math.isfinite(share) or share > 1.0 + 1e-9:
                    continue
                d2 = self._delay(model, s1 + a_new * speed, c1 + a_new)
                move = cfg.alpha * (d2 - d0) + cfg.beta * (share - share_old)
                if self.balance:
                    target = self._pick_member(model, cls, index)
                    if target is None:
                        continue
                    move += self._balance_delta(model, s1 + a_new * speed, index, target)
                threshold = 2.0 * cfg.hysteresis
                if move + threshold < 0.0:
                    found.append(_Candidate(move + threshold, move, 2, model, index, cls))
        return found

    def _evict_delta(self, index: int, model: str) -> float:
        s0 = self.speed_sum.get(model, 0.0)
        c0 = self.servers.get(model, 0.0)
        a = self.avail.get((index, model), 1.0)
        s1, c1 = s0 - a * self.speeds[index], c0 - a
        if c1 <= 1e-12:
            s1 = c1 = 0.0
        d1 = self._delay(model, s1, c1)
        return self.cfg.alpha * (d1 - self.delay[model]) - self.cfg.beta * self.share(
            model, self.class_of[index]
        )

    def _replace_candidates(self) -> list[_Candidate]:
        """For each model with demand and no replica that fits no worker as things are,
        the best single eviction that makes room for it."""
        cfg = self.cfg
        work = self.work
        found: list[_Candidate] = []
        for model in self.snapshot.models:
            if self.rates.get(model, 0.0) <= 0.0 or work.holders.get(model):
                continue
            if any(work.fits(i, model) for i in range(len(self.speeds))):
                continue
            a_new = self._new_avail(model)
            best: _Candidate | None = None
            for index in range(len(self.speeds)):
                cls = self.class_of[index]
                gain = cfg.alpha * (
                    self._delay(model, a_new * self.speeds[index], a_new) - self.delay[model]
                ) + cfg.beta * self.share(model, cls)
                for victim in work.models_on(index):
                    if not self._evictable(index, victim):
                        continue
                    if not work.fits(index, model, work.demand(victim)):
                        continue
                    delta = gain + self._evict_delta(index, victim)
                    score = delta + 2.0 * cfg.hysteresis
                    if score < 0.0 and (best is None or score < best.score):
                        best = _Candidate(score, delta, 3, model, index, cls, victim)
            if best is not None:
                found.append(best)
        return found

    def _pick_member(self, model: str, cls: int, exclude: int) -> int | None:
        """The least loaded member of kind ``cls`` (then lower utilisation, then first
        listed) that does not hold ``model``, is not ``exclude`` and fits it."""
        order = self._member_order.get(cls)
        if order is None:
            order = sorted(self.members[cls], key=lambda i: (self.load[i], self.util[i], i))
            self._member_order[cls] = order
        for index in order:
            if index == exclude or self.work.holds(index, model):
                continue
            if self.work.fits(index, model):
                return index
        return None

    # -- edits --------------------------------------------------------------------

    def _unload_share(self, model: str) -> None:
        for index in self.work.holders.get(model, ()):
            self.load[index] = max(0.0, self.load[index] - self._busy_share(model, index))

    def _reload_share(self, model: str) -> None:
        for index in self.work.holders.get(model, ()):
            self.load[index] += self._busy_share(model, index)

    def _add(self, index: int, model: str, avail: float) -> None:
        self._unload_share(model)
        self.work.load(index, model)
        restored = self.work.resident(index, model)
        if restored is not None:  # evicted earlier in this plan and kept after all
            avail = availability(restored.ready_at_s - self.snapshot.now_s, self.cfg.horizon_s)
        self.avail[(index, model)] = avail
        self.speed_sum[model] = self.speed_sum.get(model, 0.0) + avail * self.speeds[index]
        self.servers[model] = self.servers.get(model, 0.0) + avail
        self.delay[model] = self._delay(model, self.speed_sum[model], self.servers[model])
        self._reload_share(model)

    def _remove(self, index: int, model: str) -> None:
        self._unload_share(model)
        self.work.evict(index, model)
        a = self.avail.pop((index, model), 1.0)
        s = self.speed_sum.get(model, 0.0) - a * self.speeds[index]
        c = self.servers.get(model, 0.0) - a
        if c <= 1e-12:
            s = c = 0.0
        self.speed_sum[model], self.servers[model] = s, c
        self.delay[model] = self._delay(model, s, c)
        self._reload_share(model)

    def _key(self, cand: _Candidate) -> tuple[float, int, int, int, int]:
        return (cand.score, cand.kind, self.order[cand.model], cand.source, cand.target_class)

    def run(self) -> PlacementPlan:
        """Greedy descent with lazy re-scoring.

        Every model's improving actions sit in a heap, tagged with the scoring they came
        from. An applied action re-scores its own models at once; with the balance term
        every other model's scores are also out of date (the busy shares moved, so the
        state's *version* moves on), but they are re-scored only when one of them reaches
        the top of the heap (lazy greedy). The search stops only after a pass in which
        every model has been scored against the final state and none improves, so the
        plan is a local optimum as a full re-scoring after every action would find (and
        the same snapshot after the plan gives no further change)."""
        cfg = self.cfg
        actions = 0
        version = 0
        generation = 0
        scored: dict[str, tuple[int, int]] = {}  # model -> (generation, version)
        heap: list[tuple[tuple[float, int, int, int, int], int, _Candidate]] = []

        def rescore(model: str) -> None:
            nonlocal generation
            generation += 1
            scored[model] = (generation, version)
            for found in self._candidates(model):
                heapq.heappush(heap, (self._key(found), generation, found))

        for model in self.snapshot.models:
            rescore(model)
        # Every applied action lowers the cost by more than the hysteresis, so the search
        # ends; the cap only guards against a zero hysteresis and rounding.
        for _ in range(cfg.max_actions + 2 * len(self.snapshot.models) + 1):
            replace = sorted(self._replace_candidates(), key=self._key)
            applied: _Candidate | None = None
            refused: list[tuple[tuple[float, int, int, int, int], int, _Candidate]] = []
            while applied is None:
                cand: _Candidate | None = None
                while heap:
                    _, gen, top = heap[0]
                    gen_now, at = scored[top.model]
                    if gen != gen_now:  # superseded by a later scoring of its model
                        heapq.heappop(heap)
                    elif at != version:  # scored before the last action: re-score lazily
                        heapq.heappop(heap)
                        rescore(top.model)
                    else:
                        cand = top
                        break
                if replace and (cand is None or self._key(replace[0]) < self._key(cand)):
                    cand = replace.pop(0)
                elif cand is not None:
                    heapq.heappop(heap)
                if cand is None:
                    stale = [m for m in self.snapshot.models if scored[m][1] != version]
                    if not stale:
                        break
                    for model in stale:  # the closing pass: everything against this state
                        rescore(model)
                    continue
                unplaced_load = cand.kind == 0 and not self.work.holders.get(cand.model)
                if actions >= cfg.max_actions and not unplaced_load:
                    continue
                if self._apply(cand):
                    applied = cand
                    if not unplaced_load:
                        actions += 1
                elif cand.kind != 3:  # no worker of its kind fits it now: retry after
                    refused.append((self._key(cand), scored[cand.model][0], cand))
            if applied is None:
                break
            for entry in refused:  # the action may have made room
                heapq.heappush(heap, entry)
            if self.balance:  # busy shares moved on every holder: every score is stale
                version += 1
            for model in (applied.model, applied.victim):
                if model in self.order:
                    rescore(model)
        return self.work.plan(cost_s=self.cost())

    def _apply(self, cand: _Candidate) -> bool:
        model = cand.model
        touched = {model}
        if cand.kind == 0:
            target = self._pick_member(model, cand.target_class, -1)
            if target is None:
                return False
            self._add(target, model, self._new_avail(model))
        elif cand.kind == 1:
            self._remove(cand.source, model)
        elif cand.kind == 2:
            target = self._pick_member(model, cand.target_class, cand.source)
            if target is None:
                return False
            self._remove(cand.source, model)
            self._add(target, model, self._new_avail(model))
        else:
            self._remove(cand.source, cand.victim)
            self._add(cand.source, model, self._new_avail(model))
            touched.add(cand.victim)
        self._resum()
        self._member_order.clear()
        return True


class AdaptivePlacement:
    """``adaptive``: the paper's policy (see the module docstring).

    Example:
        >>> policy = AdaptivePlacement(AdaptiveConfig(alpha=1.0, beta=2.0))
        >>> policy.name
        'adaptive'
    """

    __slots__ = ("config", "name")

    def __init__(self, config: AdaptiveConfig | None = None, *, name: str = "adaptive") -> None:
        self.config = config or AdaptiveConfig()
        self.name = name

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
        return _Search(snapshot, self.config).run()


def placement_cost(snapshot: PlacementSnapshot, config: AdaptiveConfig | None = None) -> float:
    """``alpha * D + beta * U`` of the snapshot's placement as it stands."""
    return _Search(snapshot, config or AdaptiveConfig()).cost()
