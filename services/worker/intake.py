"""What a worker takes in: assignments (fenced in the request ledger) and migrations, and
what it hands on: a request prefilled here for its decode worker.

Delivery is at least once, so intake is idempotent. In this process, an assignment whose
``(request_id, epoch)`` was taken already, or whose epoch is lower than one already taken
for that request, is dropped. Across restarts the request ledger fences it: a batch of
new assignments is marked taken in one round trip
(:meth:`~switchyard.lifecycle.RequestLedger.start_many`), and only those the ledger shows
still assigned to this worker under that epoch are queued. One whose request was
answered, re-assigned or moved since (a worker restarted under its id resumes its
inbox's unread assignments, some re-assigned elsewhere meanwhile), or that this worker
took before (a redelivery), does not run.

A migration moves a request this worker holds to another worker: a waiting one at
once, a running LLM request preempted with the tokens it generated and the modelled
transfer of its KV cache. The move is recorded in the ledger first (the epoch it
replaces must still be recorded here), then the moved assignment is published to the
target's inbox partition; a move that cannot be recorded does not happen, and the
request waits here again. A hand-off (prefill/decode disaggregation) is the same move,
the worker's own: once a request's prefill gave its first token, it goes to the decode
worker its assignment names, with its KV cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from switchyard.bus import Bus
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    Migration,
    RequestTimeline,
)
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.lifecycle import Assign, Fence, RequestLedger

from services.worker.answers import AnswerOutbox
from services.worker.backends.base import Backend, Preemption, UnsupportedWorkError
from services.worker.holdings import Holdings
from services.worker.queue import WorkItem
from services.worker.telemetry import WorkerMetrics

log = logging.getLogger("switchyard.worker")


class Intake:
    """Assignments and migrations into a worker's holdings.

    Args:
        holdings: the worker's queue and held requests.
        backend: the worker's backend (a callable: it is built at start).
        ledger: the request ledger (fencing, moves).
        bus: where moved assignments are published.
        outbox: where answers go (a FAILED one for work the backend cannot serve).
        metrics: the worker's metrics.
        clock: wall seconds.
    """

    def __init__(
        self,
        holdings: Holdings,
        backend: Callable[[], Backend],
        ledger: RequestLedger,
        bus: Bus,
        outbox: AnswerOutbox,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.holdings = holdings
        self._backend = backend
        self.ledger = ledger
        self.bus = bus
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock
        self._attempted: dict[str, int] = {}
        """Request id -> the epoch this process asked the ledger to start and got no
        reply about (the round trip failed): if the store did start it, the record says
        ``running`` here when the assignment comes again, and it is ours to run."""

    @property
    def worker_id(self) -> str:
        return self.holdings.worker_id

    # -- assignments ---------------------------------------------------------------------

    async def take(self, assignments: Sequence[tuple[Assignment, Context | None]]) -> int:
        """Queue the new assignments of a batch that are ours and still ours in the
        ledger; returns how many were queued. Each comes with the trace context it was
        taken in (its CONSUMER span): what is published for it later continues it."""
        holdings = self.holdings
        fresh: dict[str, tuple[Assignment, Context | None]] = {}
        for assignment, context in assignments:
            if assignment.worker_id != self.worker_id:
                continue
            request_id = assignment.request.request_id
            seen = holdings.seen_epoch(request_id)
            if seen is not None and assignment.epoch <= seen:
                log.debug(
                    "dropped assignment of %s epoch %d: epoch %d already taken",
                    request_id,
                    assignment.epoch,
                    seen,
                )
                continue
            earlier = fresh.get(request_id)
            if earlier is None or earlier[0].epoch < assignment.epoch:
                fresh[request_id] = (assignment, context)
        if not fresh:
            return 0
        chosen = list(fresh.values())
        fences = [Fence(a.request.request_id, a.epoch, self.worker_id) for a, _ in chosen]
        unanswered = {f.request_id: self._attempted.get(f.request_id) for f in fences}
        for fence in fences:
            self._attempted[fence.request_id] = fence.epoch
        results = await self.ledger.start_many(fences, self.clock())
        queued = 0
        for (assignment, context), result in zip(chosen, results, strict=True):
            request_id = assignment.request.request_id
            holdings.remember(request_id, assignment.epoch)
            self._attempted.pop(request_id, None)
            if result == "running" and unanswered[request_id] == assignment.epoch:
                # Started by this process's earlier attempt, whose reply was lost (a store
                # timeout, then the batch came again): nobody runs it but us.
                log.warning(
                    "assignment of %s epoch %d was started by an attempt whose reply was "
                    "lost: run it",
                    request_id,
                    assignment.epoch,
                    extra={"request_id": request_id, "epoch": assignment.epoch},
                )
                result = "started"
            if result in ("started", "missing"):
                if result == "missing":
                    # No record to fence on (it expired, or the state store lost it):
                    # run it rather than lose accepted work; its answer recreates it.
                    log.warning("assignment of %s has no request record: run anyway", request_id)
                queued += await self._queue(assignment, context)
                continue
            if result == "superseded":
                self.metrics.superseded()
            reason = {
                "running": "an earlier process of this worker took it (its WorkerDown "
                "re-assigns it)",
                "answered": "the request was answered already",
                "superseded": "it was re-assigned or moved since",
            }[result]
            log.info(
                "dropped assignment of %s epoch %d: %s",
                request_id,
                assignment.epoch,
                reason,
                extra={"request_id": request_id, "epoch": assignment.epoch},
            )
        return queued

    async def _queue(self, assignment: Assignment, context: Context | None) -> int:
        holdings = self.holdings
        request_id = assignment.request.request_id
        held = holdings.held.get(request_id)
        if held is not None:
            if holdings.queue.remove(request_id) is None:
                # Given back to this worker while it runs here (it was declared dead
                # meanwhile, or a move came back): the ledger now fences on the new
                # epoch, so the run in progress becomes that epoch's run. Left on the old
                # one, its answer would be refused as superseded and nobody would run the
                # new one: the caller would never be answered.
                log.warning(
                    "assignment of %s epoch %d arrived while epoch %d runs here; the run "
                    "goes on as epoch %d",
                    request_id,
                    assignment.epoch,
                    held.epoch,
                    assignment.epoch,
                    extra={"request_id": request_id, "epoch": assignment.epoch},
                )
                held.assignment = held.assignment.model_copy(
                    update={"epoch": assignment.epoch, "assigned_at_s": assignment.assigned_at_s}
                )
                return 0
            del holdings.held[request_id]  # superseded by the newer epoch before it started
        backend = self._backend()
        try:
            spec = backend.describe(assignment)
        except UnsupportedWorkError as exc:
            log.warning("cannot serve %s: %s", request_id, exc, extra={"request_id": request_id})
            self.outbox.put(
                self._failed(assignment, str(exc), backend),
                assignment.request.reply_partition,
                context,
            )
            self.metrics.executed(CompletionStatus.FAILED, assignment.variant, None)
            return 0
        holdings.add(
            WorkItem(
                assignment=assignment,
                key=spec.key,
                received_at_s=self.clock(),
                prompt_tokens=spec.prompt_tokens,
                output_tokens=spec.output_tokens,
                generated_tokens=assignment.generated_tokens,
                brings_kv=assignment.generated_tokens > 0,
                started_s=assignment.started_s,
                first_token_s=assignment.first_token_s,
                estimate_s=spec.estimate_s,
                trace_context=context,
            )
        )
        return 1

    def refuse(self, assignment: Assignment, error: str) -> None:
        """Answer ``assignment`` as failed with ``error`` (it could not be taken in)."""
        backend = self._backend()
        self.outbox.put(
            self._failed(assignment, error, backend), assignment.request.reply_partition, None
        )
        self.metrics.executed(CompletionStatus.FAILED, assignment.variant, None)

    def _failed(self, assignment: Assignment, error: str, backend: Backend) -> Completion:
        request = assignment.request
        return Completion(
            request_id=request.request_id,
            app=request.app,
            worker_id=self.worker_id,
            worker_type=backend.worker_type,
            variant=assignment.variant,
            epoch=assignment.epoch,
            status=CompletionStatus.FAILED,
            error=error[:2000],
            timeline=RequestTimeline(
                arrival_s=request.arrival_s,
                assigned_s=assignment.decided_at_s,
                finished_s=self.clock(),
            ),
            deadline_s=assignment.deadline_s
            if assignment.deadline_s is not None
            else request.deadline_s,
            emulated=backend.emulated,
            reply_to=request.reply_to,
        )

    # -- migrations ----------------------------------------------------------------------

    async def migrate(self, migration: Migration) -> bool:
        """Move a request we hold to ``migration.to_worker_id``; True when it moved.

        A waiting request is re-assigned with ``not_before_s = now + cost_s``; a running
        LLM request is preempted and re-assigned with the tokens it generated and
        ``not_before_s = now +`` the modelled transfer of its KV cache. A request not
        held here (finished, or moved already) is ignored.
        """
        if migration.from_worker_id != self.worker_id:
            return False
        holdings = self.holdings
        request_id = migration.request_id
        item = holdings.held.get(request_id)
        if item is None:
            log.debug("migration of %s ignored: not held here", request_id)
            return False
        if migration.epoch <= item.epoch:
            log.debug(
                "migration of %s ignored: epoch %d is not newer than %d",
                request_id,
                migration.epoch,
                item.epoch,
            )
            return False
        if migration.to_inbox_partition is None:
            log.warning("migration of %s ignored: it names no inbox partition", request_id)
            return False
        now_s = self.clock()
        preempted = holdings.queue.remove(request_id) is None
        if not preempted:
            not_before_s = now_s + migration.cost_s
        else:
            preemption = self._backend().preempt(request_id)
            if preemption is None:
                log.info(
                    "migration of %s ignored: its batch is running and cannot be preempted",
                    request_id,
                )
                return False
            not_before_s = now_s + preemption.transfer_s
        update = {
            "worker_id": migration.to_worker_id,
            "epoch": migration.epoch,
            "assigned_at_s": now_s,
            "generated_tokens": item.generated_tokens,
            "not_before_s": not_before_s,
            "first_assigned_s": item.assignment.decided_at_s,
            "started_s": item.started_s,
            "first_token_s": item.first_token_s,
        }
        if migration.predicted_s is not None:
            # The target reports its work, and calibrates, on its own type's prediction.
            update["predicted_s"] = migration.predicted_s
            update["predicted_raw_s"] = migration.predicted_raw_s
        moved = item.assignment.model_copy(update=update)
        if await self._move(item, moved, migration.to_inbox_partition, "move") != "moved":
            if preempted:  # it resumes from the tokens it generated, prefilled again
                item.brings_kv = False
            holdings.queue.push(item)
            holdings.wake.set()
            return False
        return True

    async def hand_off(self, item: WorkItem, handoff: Preemption) -> None:
        """Send a request prefilled here, out of the batch with its KV cache, to the
        decode worker its assignment names (disaggregated serving), as a move: recorded
        in the ledger (epoch + 1), then published to that worker's inbox partition, with
        the tokens it generated, its start and first token, the predictions for the decode
        worker's type, and ``not_before_s = now +`` the modelled transfer. One whose move
        cannot be recorded is decoded here instead, prefilled again: nothing is lost; one
        the ledger shows answered or given to another worker meanwhile is dropped (its
        answer from here would be refused)."""
        holdings = self.holdings
        assignment = item.assignment
        target = assignment.decode
        assert target is not None, "only a request with a decode target is handed off"
        now_s = self.clock()
        moved = assignment.model_copy(
            update={
                "worker_id": target.worker_id,
                "epoch": assignment.epoch + 1,
                "assigned_at_s": now_s,
                "generated_tokens": item.generated_tokens,
                "not_before_s": now_s + handoff.transfer_s,
                "decode": None,
                # What the decode worker reports and the predictor's calibration learns
                # from are its own type's predictions.
                "predicted_s": target.predicted_s,
                "predicted_raw_s": target.predicted_raw_s,
                "first_assigned_s": assignment.decided_at_s,
                "started_s": item.started_s,
                "first_token_s": item.first_token_s,
            }
        )
        outcome = await self._move(item, moved, target.inbox_partition, "hand-off")
        if outcome == "moved":
            self.metrics.handed_off()
            return
        if outcome in ("answered", "superseded"):
            holdings.forget(item)
            self.metrics.superseded()
            return
        item.assignment = assignment.model_copy(update={"decode": None})
        item.brings_kv = False
        holdings.queue.push(item)
        holdings.wake.set()

    async def _move(self, item: WorkItem, moved: Assignment, partition: int, what: str) -> str:
        """Record ``moved`` (``item``'s assignment, now another worker's) in the ledger,
        then publish it to that worker's ``partition``; returns ``moved``, or why not:
        the ledger's answer, or ``unreachable`` (nothing was published either way:
        ``item`` is still held here)."""
        holdings = self.holdings
        request_id = item.request_id
        # Recorded before it is published, as the scheduler records its decisions: if
        # the target then dies, its WorkerDown finds the request on it. A move that
        # cannot be recorded does not happen (unrecorded, the request would be found on
        # neither worker when one dies).
        try:
            outcome = await self.ledger.assign(
                Assign(moved, replaces_epoch=item.epoch, replaces_worker=self.worker_id)
            )
            result: str = outcome.result
            reason = f"the ledger says {outcome.result}"
        except Exception as exc:
            result, reason = "unreachable", str(exc)
        recorded = result == "assigned"
        if not recorded:
            log.error(
                "the %s of %s to %s could not be recorded, so it stays here: %s",
                what,
                request_id,
                moved.worker_id,
                reason,
                extra={"request_id": request_id, "to_worker_id": moved.worker_id},
            )
            return result
        del holdings.held[request_id]
        holdings.remember(request_id, moved.epoch)
        if item.span is not None:
            item.span.end()
            item.span = None
        # In the request's trace: the target worker's handling continues it.
        with item.in_trace():
            await self.bus.publish(WORKER_INBOX, moved, partition=partition)
        # A hand-off is every request's lot on a prefill worker: not worth a line each.
        log.log(
            logging.DEBUG if what == "hand-off" else logging.INFO,
            "%s: %s to %s (epoch %d, %d tokens generated, may start in %.3f s)",
            what,
            request_id,
            moved.worker_id,
            moved.epoch,
            item.generated_tokens,
            (moved.not_before_s or moved.assigned_at_s) - moved.assigned_at_s,
            extra={"request_id": request_id, "to_worker_id": moved.worker_id},
        )
        return "moved"
