"""Deadline-aware admission control (back-pressure): admit a request only when a worker
serving its model can still finish it before its deadline.

Pure and synchronous: :class:`AdmissionGate` holds the monitor's last
:class:`~switchyard.cluster.ClusterView` (the ingress refreshes it every
``min(0.1 s, heartbeat interval / 2)``, never per request) plus this replica's own
admissions since each worker's last heartbeat, and :meth:`AdmissionGate.decide` answers
one request from them with the time passed in. The ingress calls it after a request's id
is claimed and before anything is recorded or published, so a refused request leaves no
trace to lose.

**The estimate**, for each live worker (``alive`` per the monitor, heard from within
``SWITCHYARD_WORKER_TIMEOUT_S``, not draining) that serves the request's model:

- *service time* ``s``: an LLM request on a worker with a known performance profile
  (``GPU/model``) takes the profile's idle service time of its prompt and
  ``max_tokens`` (:meth:`~switchyard.perf.PerformanceModel.idle_service_s`) divided by
  the heartbeat's ``time_scale``; an LLM request on a worker without a profile (the
  torch language model) takes ``decode_step_s * (max_tokens + 1)`` from the heartbeat;
  a classification request takes the application's fastest profiled batch-of-one
  latency (:data:`DEFAULT_SERVICE_S` when it has none).
- *parallelism*: a profiled LLM worker runs continuous batches of up to ``n`` requests
  like this one, ``n = min(max_slots, kv_capacity_tokens // (prompt + max_tokens))``
  (the engine reserves each request's whole context). In a batch of ``k`` that turns
  over, a request sees ``k`` prefills (its own, and the newcomers' that take the slots
  freed meanwhile: the engine does not chunk prefills, so each pauses the decode) and
  ``max_tokens - 1`` decode steps of ``k`` sequences: ``loaded(k) = k * prefill(prompt)
  + (max_tokens - 1) * step(k, k * c)`` with ``c = prompt + max_tokens / 2`` the mean
  context, ``slowdown(k) = loaded(k) / s``. A worker that reports its recent share ``p``
  of time spent prefilling (the heartbeat's ``prefill_share``) decodes only ``1 - p`` of
  the time, so the prefills' pause is at least ``decode * p / (1 - p)`` (``p`` counted up
  to :data:`MAX_PREFILL_SHARE`): a stream of short requests (a verifier's one-token
  verdicts) brings more prompts than the batch's own turnover. A full worker therefore
  serves ``rate = n / slowdown(n)`` seconds of idle service time per wall second (for
  the conversation sample on ``a100-80gb/llama-2-7b`` about 4 requests per modelled
  second, which is what the emulated worker achieves). Any other worker reports ``queued_work_s``
  already as wall seconds to drain (its batches estimated whole): ``n = rate = 1``.
- *backlog* ``W``: the heartbeat's ``queued_work_s`` (waiting requests whole, running
  ones what is left), less ``rate`` times the seconds since the monitor received that
  heartbeat, plus the service times of the requests this replica admitted to that
  worker since (local accounting, as the scheduler's :mod:`switchyard.cluster.placer`
  does; cleared by the first heartbeat sent after them).
- *expected finish*: with a free slot (running + waiting + admitted-since < ``n``) and,
  on a worker that reports its KV cache, room in it for the request's whole context
  (capacity less ``queued_tokens``, what running and waiting requests hold or will, less
  the contexts admitted since: a batch slot is no use while the KV is taken) the
  request starts at once and runs in a batch one larger: ``s * slowdown(k + 1)``;
  otherwise it waits for the backlog to drain at the full-batch rate:
  ``W / rate + s * slowdown(n)``. (``W / rate`` counts the running requests' remaining
  work too, so it errs long by about half a loaded service time.)

**Calibration** (:mod:`services.ingress.calibration`), for LLM requests. The estimate
is only as good as the worker's profile and the batch model above; a worker slower than
its profile (another clock, a busy host) would be admitted to right up to every
deadline and miss them. So the gate learns from the LLM requests it admitted: when one
is answered (:meth:`AdmissionGate.answered`, told of every answer this replica
receives), it keeps how much later than estimated it finished (its finish less its
estimate, counted from its judgement or its last assignment, whichever is later: a
delay before assignment is the control plane's, a failover's, not the worker's), per
model, and adds the calibration quantile of those
errors, when positive, to every later estimate for that model, as the pipeline gate does
for calls. A classification request is not calibrated: its estimate is one profiled
batch, and the window scheduler holds requests for a window by design.

The least-loaded worker (smallest expected finish) is the one the request is judged
on. It is **rejected with 429** when that expected finish, calibrated, exceeds
``slack`` times the time left to its deadline (``SWITCHYARD_ADMISSION_SLACK``). A
request that cannot make its deadline even on an idle worker is admitted only when it
would start at once (it delays no one's start); one that would wait is refused like any
other, so requests that are late whatever happens cannot pile up in front of the ones
that can still be on time. ``Retry-After`` is the time for the backlog to drain enough that the
same request, arriving fresh, would be admitted: ``expected - slack * (deadline -
arrival)``, rounded up, at least 1 s.

It is **rejected with 503** when no live worker has served the model for longer than
``grace_s`` (``SWITCHYARD_ADMISSION_GRACE_S``; counted from the first refresh when none
ever did), with ``Retry-After`` :data:`NO_WORKER_RETRY_AFTER_S`. Within the grace the
request is admitted: the scheduler parks it until a worker appears (a restart).

**Failing open.** Before the first refresh the gate knows nothing and admits
everything; it never rejects because the ingress just started. Replicas do not share
their local accounting, so with several ingress replicas each sees the others'
admissions only through the next heartbeat.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from switchyard.cluster import ClusterView, WorkerRecord
from switchyard.contracts.messages import Completion, CompletionStatus, Heartbeat
from switchyard.perf import PerformanceModel
from switchyard.perf.profiles import UnknownProfileError, performance_model

from services.ingress.calibration import CALIBRATION_HORIZON, EstimateErrors

__all__ = [
    "DEFAULT_SERVICE_S",
    "IN_TRANSIT_S",
    "NO_WORKER_RETRY_AFTER_S",
    "AdmissionGate",
    "Decision",
    "Demand",
    "Verdict",
    "estimate",
]

DEFAULT_SERVICE_S = 0.01
"""Service time of a request nothing better is known about (wall seconds)."""
NO_WORKER_RETRY_AFTER_S = 5
"""``Retry-After`` of a 503 for a model no live worker serves: about a worker's start."""
IN_TRANSIT_S = 0.05
"""A heartbeat sent less than this after an admission may not reflect it yet (the
request is still on its way through the scheduler): such admissions stay accounted."""
MAX_PREFILL_SHARE = 0.9
"""A worker's prefill share is counted up to this (its decode then runs a tenth of the
time): a share near 1 is a worker prefilling back to back, whose decode estimate would
otherwise be unbounded."""
JUDGED_KEPT = 20_000
"""Admitted LLM requests whose answers the gate waits for to calibrate (the oldest is
forgotten beyond this: its answer never came here)."""


class Verdict(StrEnum):
    ADMIT = "admit"
    OVERLOADED = "overloaded"  # 429
    NO_WORKER = "no_worker"  # 503


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one request asks of the cluster.

    Attributes:
        kind: ``llm`` or ``classification``.
        model: the served model (LLM) or the application (classification): what a
            worker's ``servable_models`` must name.
        prompt_tokens, output_tokens: an LLM request's prompt and ``max_tokens``.
        service_s: its service time when no performance profile gives one (a
            classification application's profiled latency); None: estimate it from the
            worker (see the module documentation).
        arrival_s: when the ingress received it (epoch seconds).
        deadline_s: its absolute deadline (the application's default when it gave none).
    """

    kind: Literal["llm", "classification"]
    model: str
    arrival_s: float
    deadline_s: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    service_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The gate's answer for one request.

    Attributes:
        verdict: admit, or why not.
        worker_id: the least-loaded worker it was judged on (None without one).
        wait_s: estimated wait before it starts there.
        service_s: estimated service time there, under that worker's load.
        time_left_s: seconds left to its deadline when it was judged.
        retry_after_s: whole seconds a refused client should wait (0 when admitted).
        reason: one line saying why (for logs; admitted requests too).
    """

    verdict: Verdict
    worker_id: str | None = None
    wait_s: float = 0.0
    service_s: float = 0.0
    time_left_s: float = 0.0
    retry_after_s: int = 0
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return self.verdict is Verdict.ADMIT

    @property
    def expected_s(self) -> float:
        """Estimated seconds from now until it finishes."""
        return self.wait_s + self.service_s


@dataclass(frozen=True, slots=True)
class _Shape:
    """How a request of one size runs on one profile (wall seconds)."""

    idle_s: float  # alone on an idle worker
    slots: int  # how many like it a batch holds
    slowdown: Callable[[int, float], float]
    """Its time in a batch of k over its time alone, given the worker's prefill share."""
    quiet_rate: float
    """:meth:`rate` with no prefill share reported, computed once with the shape."""

    def rate(self, prefill_share: float) -> float:
        """Idle-service seconds a full worker serves per wall second."""
        if prefill_share <= 0.0:
            return self.quiet_rate
        return self.slots / self.slowdown(self.slots, prefill_share)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """The expected wait and service of one request on one worker."""

    worker_id: str
    wait_s: float
    service_s: float
    idle_service_s: float

    @property
    def expected_s(self) -> float:
        return self.wait_s + self.service_s


@dataclass(slots=True)
class _Pending:
    """Work this replica admitted to a worker, each with when it was admitted."""

    admissions: list[tuple[float, float, int]] = field(default_factory=list)
    """(admitted at, idle service seconds, context tokens) of each."""

    def forget_before(self, sent_at_s: float) -> None:
        self.admissions = [a for a in self.admissions if a[0] > sent_at_s - IN_TRANSIT_S]

    @property
    def count(self) -> int:
        return len(self.admissions)

    @property
    def work_s(self) -> float:
        return sum(s for _, s, _ in self.admissions)

    @property
    def tokens(self) -> int:
        return sum(t for _, _, t in self.admissions)


@dataclass(frozen=True, slots=True)
class _Judged:
    """An admitted LLM request, until its answer: what it teaches the calibration."""

    model: str
    judged_at_s: float
    expected_s: float  # uncalibrated
    horizon_s: float


@functools.cache
def _profile(name: str) -> PerformanceModel | None:
    try:
        return performance_model(name)
    except UnknownProfileError:
        return None


@functools.lru_cache(maxsize=8192)
def _shape(
    profile: str, prompt: int, output: int, max_slots: int, kv_capacity: int, scale: float
) -> _Shape | None:
    perf = _profile(profile)
    if perf is None:
        return None
    size = max(1, prompt + output)
    slots_cap = max_slots or perf.max_batch_slots
    kv_cap = kv_capacity or perf.kv_capacity_tokens
    slots = max(1, min(slots_cap, kv_cap // size))
    context = max(1, prompt + output // 2)
    prefill_s = perf.prefill_s((max(1, prompt),))
    decode_steps = max(0, output - 1)
    lone_s = perf.idle_service_s(max(0, prompt), max(1, output))

    def slowdown(batch: int, prefill_share: float) -> float:
        # In a batch of k that turns over, k prefills (its own and k - 1 newcomers'
        # taking the slots that free up) pause the decode, and each step costs step(k).
        # A worker measured prefilling a share p of its time decodes only 1 - p of it:
        # newcomers that are not the batch's own turnover (short requests) pause it more.
        batch = max(1, min(batch, slots))
        decode_s = decode_steps * perf.decode_step_s(batch, batch * context)
        pause_s = batch * prefill_s
        if prefill_share > 0.0:
            share = min(prefill_share, MAX_PREFILL_SHARE)
            pause_s = max(pause_s, prefill_s + decode_s * share / (1.0 - share))
        return max(1.0, (pause_s + decode_s) / lone_s) if lone_s > 0 else 1.0

    quiet_rate = slots / slowdown(slots, 0.0)
    return _Shape(idle_s=lone_s / scale, slots=slots, slowdown=slowdown, quiet_rate=quiet_rate)


def estimate(
    demand: Demand,
    record: WorkerRecord,
    now_s: float,
    pending_count: int = 0,
    pending_work_s: float = 0.0,
    pending_tokens: int = 0,
) -> Estimate:
    """The expected wait and service of ``demand`` on the worker of ``record`` at
    ``now_s``, given what was admitted to it since its heartbeat (module documentation).
    ``record.heartbeat`` must not be None."""
    heartbeat = record.heartbeat
    assert heartbeat is not None
    shape = _llm_shape(demand, heartbeat)
    share = heartbeat.prefill_share
    if shape is not None:
        own_s, slots, rate, slowdown = shape.idle_s, shape.slots, shape.rate(share), shape.slowdown
    else:
        own_s, slots, rate = _plain_service_s(demand, heartbeat), 1, 1.0

        def slowdown(batch: int, prefill_share: float) -> float:
            return 1.0

    age_s = max(0.0, now_s - record.last_seen_s)
    backlog_s = max(0.0, heartbeat.queued_work_s - rate * age_s) + pending_work_s
    occupancy = heartbeat.running + heartbeat.queue_length + pending_count
    if occupancy < slots and _kv_room(demand, heartbeat, pending_tokens, shape is not None):
        wait_s, service_s = 0.0, own_s * slowdown(occupancy + 1, share)
    else:
        wait_s, service_s = backlog_s / rate, own_s * slowdown(slots, share)
    return Estimate(
        worker_id=record.worker_id, wait_s=wait_s, service_s=service_s, idle_service_s=own_s
    )


def _kv_room(demand: Demand, heartbeat: Heartbeat, pending_tokens: int, profiled: bool) -> bool:
    """Whether the worker's KV cache can take the request's whole context now; True
    where the worker does not report one."""
    if not profiled or heartbeat.kv_capacity_tokens <= 0:
        return True
    free = heartbeat.kv_capacity_tokens - heartbeat.queued_tokens - pending_tokens
    return free >= demand.prompt_tokens + demand.output_tokens


def _llm_shape(demand: Demand, heartbeat: Heartbeat) -> _Shape | None:
    if demand.kind != "llm" or not heartbeat.profile:
        return None
    return _shape(
        heartbeat.profile,
        demand.prompt_tokens,
        demand.output_tokens,
        heartbeat.max_slots,
        heartbeat.kv_capacity_tokens,
        heartbeat.time_scale,
    )


def _plain_service_s(demand: Demand, heartbeat: Heartbeat) -> float:
    if demand.service_s is not None:
        return demand.service_s
    if demand.kind == "llm" and heartbeat.decode_step_s > 0:
        return heartbeat.decode_step_s * (demand.output_tokens + 1)
    return DEFAULT_SERVICE_S


def _serves(heartbeat: Heartbeat, demand: Demand) -> bool:
    if demand.kind == "llm":
        return demand.model in heartbeat.servable_models
    app = demand.model  # a classification worker lists "app/variant" per variant
    return any(m == app or m.startswith(f"{app}/") for m in heartbeat.servable_models)


def _served_keys(heartbeat: Heartbeat) -> set[str]:
    keys: set[str] = set()
    for model in heartbeat.servable_models:
        keys.add(model)
        app, sep, _ = model.partition("/")
        if sep:
            keys.add(app)
    return keys


class AdmissionGate:
    """The cluster as last read, this replica's admissions since, and the decision.

    Args:
        slack: a request is refused when its expected finish exceeds ``slack`` times the
            time left to its deadline (> 0; below 1 keeps headroom for estimation
            error).
        grace_s: how long a model may have no live worker before requests for it get
            503.
        worker_timeout_s: a worker not heard from for this long is not live
            (``SWITCHYARD_WORKER_TIMEOUT_S``).
    """

    def __init__(
        self, *, slack: float = 1.0, grace_s: float = 10.0, worker_timeout_s: float = 2.0
    ) -> None:
        if not (math.isfinite(slack) and slack > 0):
            raise ValueError(f"slack must be a finite number > 0, got {slack}")
        if not (grace_s >= 0):
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.slack = slack
        self.grace_s = grace_s
        self.worker_timeout_s = worker_timeout_s
        self._view: ClusterView | None = None
        self._first_refresh_s: float | None = None
        self._served_at_s: dict[str, float] = {}
        self._pending: dict[str, _Pending] = {}
        self._judged: dict[str, _Judged] = {}
        """Admitted LLM requests not yet answered, oldest first."""
        self._errors: dict[str, EstimateErrors] = {}
        """Per model: how much later than estimated the latest admitted requests finished."""

    @property
    def ready(self) -> bool:
        """Whether a cluster view was read (before that the gate admits everything)."""
        return self._view is not None

    def observe(self, view: ClusterView) -> None:
        """Take a fresh read of the monitor's records (at ``view.now_s``)."""
        if self._first_refresh_s is None:
            self._first_refresh_s = view.now_s
        present = set()
        for record in view.workers:
            heartbeat = record.heartbeat
            if heartbeat is None:
                continue
            present.add(record.worker_id)
            pending = self._pending.get(record.worker_id)
            if pending is not None:
                pending.forget_before(heartbeat.sent_at_s)
                if not pending.admissions:
                    del self._pending[record.worker_id]
            if self._live(record):
                for key in _served_keys(heartbeat):
                    self._served_at_s[key] = view.now_s
        for worker_id in [w for w in self._pending if w not in present]:
            del self._pending[worker_id]
        self._view = view

    def _live(self, record: WorkerRecord) -> bool:
        return record.takes_work(self.worker_timeout_s)

    def decide(self, demand: Demand, now_s: float, request_id: str | None = None) -> Decision:
        """Admit or refuse ``demand`` at ``now_s``; an admitted request is accounted to
        the worker it was judged on until that worker's next heartbeat, and an admitted
        LLM request named by ``request_id`` calibrates the gate once answered."""
        view = self._view
        time_left_s = demand.deadline_s - now_s
        if view is None:
            return Decision(
                verdict=Verdict.ADMIT,
                time_left_s=time_left_s,
                reason="no cluster view yet (fail open)",
            )
        best: Estimate | None = None
        for record in view.workers:
            heartbeat = record.heartbeat
            if heartbeat is None or not self._live(record) or not _serves(heartbeat, demand):
                continue
            if heartbeat.role == "decode":
                continue  # it takes no new request: the prefill pool does
            pending = self._pending.get(record.worker_id)
            found = estimate(
                demand,
                record,
                now_s,
                pending.count if pending else 0,
                pending.work_s if pending else 0.0,
                pending.tokens if pending else 0,
            )
            if best is None or found.expected_s < best.expected_s:
                best = found
        if best is None:
            return self._without_worker(demand, now_s, time_left_s)
        budget_s = self.slack * time_left_s
        fits_idle = best.idle_service_s <= budget_s
        margin_s = self.margin_s(demand.model, now_s) if demand.kind == "llm" else 0.0
        # The margin is time the estimate leaves out: counted as waiting.
        wait_s, service_s = best.wait_s + margin_s, best.service_s
        # Late even idle: admitted only when it starts at once, queued behind no one.
        if wait_s + service_s > budget_s and (fits_idle or best.wait_s > 0):
            relative_s = self.slack * (demand.deadline_s - demand.arrival_s)
            retry_s = max(1, math.ceil(wait_s + service_s - relative_s))
            calibrated = f" (calibration {margin_s:+.3f} s)" if margin_s > 0 else ""
            return Decision(
                verdict=Verdict.OVERLOADED,
                worker_id=best.worker_id,
                wait_s=wait_s,
                service_s=service_s,
                time_left_s=time_left_s,
                retry_after_s=retry_s,
                reason=(
                    f"expected wait {wait_s:.3f} s + service {service_s:.3f} s on "
                    f"{best.worker_id}{calibrated} > {self.slack:g} x {time_left_s:.3f} s left"
                ),
            )
        pending = self._pending.setdefault(best.worker_id, _Pending())
        tokens = demand.prompt_tokens + demand.output_tokens if demand.kind == "llm" else 0
        pending.admissions.append((now_s, best.idle_service_s, tokens))
        if request_id is not None and demand.kind == "llm":
            self._judge(request_id, demand, now_s, best.expected_s)
        return Decision(
            verdict=Verdict.ADMIT,
            worker_id=best.worker_id,
            wait_s=wait_s,
            service_s=service_s,
            time_left_s=time_left_s,
            reason="fits its deadline"
            if fits_idle
            else "cannot fit even idle, starts at once (not overload)",
        )

    # -- calibration -----------------------------------------------------------------

    def _judge(self, request_id: str, demand: Demand, now_s: float, expected_s: float) -> None:
        judged = self._judged
        judged.pop(request_id, None)  # judged again (a retry): the latest judgement counts
        if len(judged) >= JUDGED_KEPT:
            del judged[next(iter(judged))]
        horizon_s = CALIBRATION_HORIZON * max(0.0, demand.deadline_s - demand.arrival_s)
        judged[request_id] = _Judged(demand.model, now_s, expected_s, horizon_s)

    def forget(self, request_id: str) -> None:
        """The request admitted as ``request_id`` was not accepted after all (a retry of
        an earlier one, or the store refused it): its answer teaches nothing."""
        self._judged.pop(request_id, None)

    def answered(self, completion: Completion) -> None:
        """An answer reached this replica: if it is an LLM request admitted here, learn
        how much later than estimated it finished (module documentation)."""
        judged = self._judged.pop(completion.request_id, None)
        finished_s = completion.timeline.finished_s
        if judged is None or finished_s is None or completion.status != CompletionStatus.OK:
            return
        errors = self._errors.get(judged.model)
        if errors is None:
            errors = self._errors[judged.model] = EstimateErrors()
        # From its (last) assignment on: the time before it is the control plane's (a
        # scheduler's failover, a re-assignment after a worker died), which the estimate
        # of a worker's wait and service does not cover and a margin would only carry
        # past the fault.
        assigned_s = completion.timeline.assigned_s
        start_s = judged.judged_at_s if assigned_s is None else max(judged.judged_at_s, assigned_s)
        late_s = finished_s - (start_s + judged.expected_s)
        errors.add(late_s, finished_s + judged.horizon_s)

    def margin_s(self, model: str, now_s: float) -> float:
        """What the gate adds to ``model``'s LLM estimates at ``now_s``: the calibration
        quantile of its errors when positive, else 0."""
        errors = self._errors.get(model)
        late_s = errors.quantile(now_s) if errors is not None else None
        return 0.0 if late_s is None else max(0.0, late_s)

    def _without_worker(self, demand: Demand, now_s: float, time_left_s: float) -> Decision:
        assert self._first_refresh_s is not None
        since_s = max(self._served_at_s.get(demand.model, -math.inf), self._first_refresh_s)
        return without_worker(now_s - since_s, self.grace_s, time_left_s, "live worker")


def without_worker(missing_s: float, grace_s: float, time_left_s: float, what: str) -> Decision:
    """The decision when no ``what`` has been live for ``missing_s``: admitted within
    ``grace_s`` (a restart: the work waits for one), else 503 with ``Retry-After``."""
    if missing_s <= grace_s:
        return Decision(
            verdict=Verdict.ADMIT,
            time_left_s=time_left_s,
            reason=f"no {what} for {missing_s:.1f} s, within the grace period",
        )
    return Decision(
        verdict=Verdict.NO_WORKER,
        time_left_s=time_left_s,
        retry_after_s=NO_WORKER_RETRY_AFTER_S,
        reason=f"no {what} for {missing_s:.1f} s",
    )
