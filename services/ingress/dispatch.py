"""Direct dispatch (``SWITCHYARD_LLM_DISPATCH=direct``): the ingress places an LLM request
itself and sends the assignment to its worker, instead of publishing the request to the
scheduler.

The decision is the scheduler's own: the same :class:`~switchyard.cluster.placer.LlmPlacer`
over the monitor's worker records (read with the admission gate's, every
``min(0.1 s, heartbeat interval / 2)``), the same registered policy, the predictor's
published model applied in-process. A new request is placed before it is recorded
(:meth:`DirectDispatcher.decide`), so that its acceptance and its first decision are one
round trip to the ledger (``accept_decided``: the record is created ``assigned``, calls
arriving together share the round trip); then :meth:`DirectDispatcher.send` sends the
assignment. A retry that re-publishes a request goes through the ledger's ``assign``,
whose answer decides what is sent, as in the scheduler's
:mod:`~services.scheduler.outbox`:

- ``assigned``: the assignment, to the worker's partition of ``switchyard.worker-inbox``;
- ``exists``: the request was decided before (a retry re-publishing it): the *recorded*
  assignment again (same message id: the worker drops a copy, and its start is fenced);
- ``answered``, ``superseded``: nothing;
- ``missing`` (the record is gone), or no live worker serves the model, or the worker
  names no inbox partition: the request goes to the scheduler, which parks, retries and
  fails it as it does any request.

What changes is the path (one Kafka hop and one process fewer a request) and the
accounting: each ingress replica adds only its own decisions to the heartbeats it read,
as each scheduler replica does. Re-assignments after a worker's death or drain stay with
the scheduler, which reads the worker's assigned set the ledger keeps either way.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from opentelemetry import context as otel_context
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from switchyard.bus import Bus
from switchyard.cluster import ClusterView
from switchyard.cluster.placer import LlmPlacer
from switchyard.cluster.published_model import PublishedModelReader
from switchyard.contracts.messages import InferenceRequest, LLMPayload
from switchyard.contracts.topics import WORKER_INBOX, requests_topic
from switchyard.lifecycle import Assign, AssignOutcome, RequestLedger
from switchyard.policies.base import NoWorkerError
from switchyard.policies.registry import LlmPolicy
from switchyard.runtime.group_commit import GroupCommit
from switchyard.state.base import StateStore
from switchyard.telemetry import trace_carrier
from switchyard.telemetry.observables import instruments_once

_SCOPE = "switchyard.ingress"


class _DispatchCounts:
    """``switchyard.ingress.dispatched``: LLM requests by ``policy`` and ``outcome``
    (``assigned``, ``resent``, ``skipped``: answered or moved meanwhile, ``scheduler``:
    handed to the scheduler, ``refused``: the policy's admission said no)."""

    def __init__(self, meter: Meter) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        meter.create_observable_counter(
            "switchyard.ingress.dispatched",
            callbacks=[self._observe],
            unit="{request}",
            description="LLM requests the ingress placed itself, by outcome.",
        )

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        for (policy, outcome), count in list(self.counts.items()):
            yield Observation(count, {"policy": policy, "outcome": outcome})


class DirectDispatcher:
    """Places LLM requests in the ingress (module docstring).

    Args:
        bus: where assignments (and requests for the scheduler) are published.
        state: the store of the request ledger and the predictor's model.
        policy: the registered LLM policy bundle.
        worker_timeout_s: a worker silent this long takes no work.
        model_interval_s: how often the predictor's model is looked for.
        meter_provider: where ``switchyard.ingress.dispatched`` goes.
    """

    def __init__(
        self,
        bus: Bus,
        state: StateStore,
        policy: LlmPolicy,
        *,
        worker_timeout_s: float,
        model_interval_s: float,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.bus = bus
        self.policy = policy
        self.placer = LlmPlacer(policy)
        self.ledger = RequestLedger(state)
        self._worker_timeout_s = worker_timeout_s
        self._model = PublishedModelReader(state, interval_s=model_interval_s)
        self._assigns: GroupCommit[Assign, AssignOutcome] = GroupCommit(self.ledger.assign_many)
        self._counts = instruments_once(meter_provider, _SCOPE, _DispatchCounts).counts

    async def observe(self, view: ClusterView) -> None:
        """Take a read of the monitor's worker records (and, when due, the predictor's
        latest model)."""
        self.placer.observe_cluster(view, self._worker_timeout_s)
        self.placer.predictor = await self._model.refresh_due(view.now_s)

    def refusal(self, request: InferenceRequest) -> str | None:
        """Why the policy's admission refuses a new LLM ``request`` (None: it takes it, or
        the policy has none, or it is not an LLM request)."""
        if not isinstance(request.payload, LLMPayload):
            return None
        refused = self.placer.refusal(request, time.time())
        if refused is None:
            return None
        self._counts[self.policy.name, "refused"] += 1
        return refused.reason

    def decide(self, request: InferenceRequest) -> Assign | None:
        """The first decision for a new ``request``, to be recorded with its acceptance
        (:meth:`~switchyard.lifecycle.RequestLedger.accept_decided_many`: one round trip
        for both) and then :meth:`send`; None when this replica cannot both place it and
        address its worker (the request then goes through :meth:`publish`)."""
        if not isinstance(request.payload, LLMPayload):
            return None
        now_s = time.time()
        try:
            placed = self.placer.place(request, now_s)
        except NoWorkerError:
            return None
        assignment = placed.assignment(request, self.policy.name, epoch=0, assigned_at_s=now_s)
        if self.placer.inbox_partition(assignment.worker_id) is None:
            return None
        # The decision's trace (the call's) is kept with the record: a re-assignment
        # after the worker's death continues it.
        return Assign(assignment, trace=trace_carrier(otel_context.get_current()))

    async def send(self, decided: Assign) -> None:
        """Send a recorded first decision (:meth:`decide`) to its worker's partition;
        returns once the broker stored it."""
        assignment = decided.assignment
        partition = self.placer.inbox_partition(assignment.worker_id)
        if partition is None:
            # The worker's partition was lost since the decision (a newer heartbeat names
            # none): the scheduler sends the recorded assignment.
            await self._to_scheduler(assignment.request)
            return
        await self.bus.publish(WORKER_INBOX, assignment, partition=partition)
        self._counts[self.policy.name, "assigned"] += 1

    async def publish(self, request: InferenceRequest) -> None:
        """Place an accepted ``request`` (or find its recorded decision) and send its
        assignment, or hand it to the scheduler; returns once the broker stored what was
        sent. For a request accepted without a decision, and for a retry's re-publish."""
        decided = self.decide(request)
        if decided is None:
            await self._to_scheduler(request)
            return
        outcome = await self._assigns.submit(decided)
        if outcome.result == "assigned":
            sent, label = decided.assignment, "assigned"
        elif outcome.result == "exists" and outcome.recorded is not None:
            sent, label = outcome.recorded, "resent"
        elif outcome.result in ("answered", "superseded"):
            self._counts[self.policy.name, "skipped"] += 1
            return
        else:  # missing: the record is gone; the scheduler records it again
            await self._to_scheduler(request)
            return
        partition = self.placer.inbox_partition(sent.worker_id)
        if partition is None:
            # Recorded on a worker this replica cannot address (its heartbeat names no
            # partition): the scheduler sends the recorded assignment.
            await self._to_scheduler(request)
            return
        await self.bus.publish(WORKER_INBOX, sent, partition=partition)
        self._counts[self.policy.name, label] += 1

    async def _to_scheduler(self, request: InferenceRequest) -> None:
        await self.bus.publish(requests_topic(request), request)
        self._counts[self.policy.name, "scheduler"] += 1


__all__ = ["DirectDispatcher"]
