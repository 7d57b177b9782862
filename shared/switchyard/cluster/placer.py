"""Placing LLM requests live: the shell around an LLM assignment policy that the
scheduler (and, with ``SWITCHYARD_LLM_DISPATCH=direct``, each ingress replica) runs.

Pure and synchronous: from worker heartbeats (as the monitor stored them) and the
request, predicted in-process with the predictor's latest published model
(:class:`~switchyard.prediction.snapshot.FittedPredictor`: no round trip per request),
build the same frozen views the simulator builds (:mod:`switchyard.policies.snapshot`),
ask the policy, and account for the decision locally until the worker's next heartbeat
reflects it (:class:`~switchyard.policies.sent_since_heartbeat.SentSinceHeartbeat`).

Worker types are ``GPU/model`` names (the performance profile of an emulated worker,
``cpu/tiny-lm`` for the torch language model), the keys of the predictions.

For a prefix-aware policy (``LlmPolicy.prefix_aware``) the placer also keeps, per
worker, an index of the prompt blocks it sent there (a
:class:`~switchyard.perf.prefix_cache.PrefixCache` the size of the worker's KV cache),
and tells the policy how many of a request's prompt tokens each worker should hold:
llm-d's approximate prefix scorer, which also guesses from where it routed rather than
from the workers' caches. A restarted worker's lost cache, and what other replicas
routed, are not known to it. A policy with an admission (``LlmPolicy.admission``) is
asked through :meth:`LlmPlacer.refusal` before the request is recorded, with the same
views.

In a cluster with decode workers (prefill/decode disaggregation,
:mod:`switchyard.policies.disaggregation`), a new request is placed over the prefill pool
(and mixed workers); one placed on a ``prefill`` worker gets its decode worker at once,
the policy asked again over the decode pool, with the predictions for that worker's
type, and that worker's pending work counts it. Choosing both at arrival, as
Splitwise's and llm-d's schedulers do, keeps the hand-off to one message from the
prefill worker to the decode worker; the simulator chooses when the prefill ends, from
fresher loads, unless told to choose as this does (``decode_at_arrival``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from switchyard.cluster.records import ClusterView
from switchyard.cluster.views import worker_view
from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS
from switchyard.contracts.messages import (
    Assignment,
    DecodeTarget,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
)
from switchyard.perf.prefix_cache import PrefixCache, cached_tokens
from switchyard.policies.base import DecisionContext, NoWorkerError, Placement, Refusal
from switchyard.policies.disaggregation import decode_pool, place_decode, prefill_pool
from switchyard.policies.registry import LlmPolicy
from switchyard.policies.sent_since_heartbeat import SentSinceHeartbeat
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerRole, WorkerView
from switchyard.prediction.snapshot import FittedPredictor
from switchyard.prediction.views import LlmRequestFacts, predict, request_view


def llm_worker_type(heartbeat: Heartbeat, model: str) -> str:
    """The worker type under which a worker serves ``model``: its profile, or
    ``device/model`` for a worker without one (the torch language model)."""
    return heartbeat.profile or f"{heartbeat.worker_type}/{model}"


def llm_worker_view(heartbeat: Heartbeat, model: str, *, alive: bool) -> WorkerView:
    """The policy's view of one worker serving ``model``, from its last heartbeat."""
    view = worker_view(heartbeat, alive=alive and not heartbeat.draining)
    return replace(view, worker_type=llm_worker_type(heartbeat, model))


def request_facts(request: InferenceRequest) -> LlmRequestFacts:
    """What the prediction and the policy know of an LLM request."""
    payload = request.payload
    if not isinstance(payload, LLMPayload):
        raise TypeError(f"request {request.request_id} is not an LLM request")
    return LlmRequestFacts(
        request_id=request.request_id,
        arrival_s=request.arrival_s,
        prompt_tokens=payload.prompt_tokens,
        workload=payload.workload,
        model=payload.model,
        output_tokens_hint=payload.output_tokens_hint,
        deadline_s=request.deadline_s,
        ttft_slo_s=payload.ttft_slo_s,
    )


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a request goes and what was predicted of it there."""

    placement: Placement
    view: RequestView
    worker_type: str
    predicted_s: float | None
    """The calibrated prediction on the chosen worker's type (None: none)."""
    predicted_raw_s: float | None
    """The raw prediction there: the worker reports it back for calibration."""
    decode: DecodeTarget | None = None
    """Disaggregated: where its decode runs (None: where it is prefilled)."""

    def assignment(
        self, request: InferenceRequest, policy: str, *, epoch: int, assigned_at_s: float
    ) -> Assignment:
        """The :class:`Assignment` that carries this decision to its worker."""
        return Assignment(
            request=request,
            worker_id=self.placement.worker_id,
            variant=self.view.model,
            order=request.arrival_s,
            policy=policy,
            epoch=epoch,
            predicted_s=self.predicted_s,
            predicted_raw_s=self.predicted_raw_s,
            deadline_s=request.deadline_s,
            assigned_at_s=assigned_at_s,
            decode=self.decode,
        )


class LlmPlacer:
    """Decides LLM placements over the latest heartbeats plus its own recent decisions.

    Args:
        policy: the LLM policy bundle (its assignment policy decides).
        ctx_seed: seed of the decision context's randomness.
    """

    def __init__(self, policy: LlmPolicy, ctx_seed: int = 0) -> None:
        import random

        self.policy = policy
        self.predictor: FittedPredictor | None = None
        """The predictor's latest published model (None until one is read)."""
        self._rng = random.Random(ctx_seed)
        self._sequence = 0
        self._heartbeats: dict[str, Heartbeat] = {}
        self._alive: dict[str, bool] = {}
        self._pending: dict[str, SentSinceHeartbeat] = {}
        # (worker, model) -> the heartbeat and liveness a view was built from, and the
        # view: a heartbeat is read ten times a second and decided on per request.
        self._views: dict[tuple[str, str], tuple[Heartbeat, bool, WorkerView]] = {}
        self._prefixes: dict[str, PrefixCache] = {}

    def observe(self, heartbeat: Heartbeat, *, alive: bool) -> None:
        """Take a worker's latest heartbeat (as the monitor stored it: a restarted worker's
        first one included); forget the local accounting a newer heartbeat covers."""
        self._heartbeats[heartbeat.worker_id] = heartbeat
        self._alive[heartbeat.worker_id] = alive
        pending = self._pending.get(heartbeat.worker_id)
        if pending is not None and heartbeat.sent_at_s > pending.since_sent_at_s:
            del self._pending[heartbeat.worker_id]

    def observe_cluster(self, view: ClusterView, worker_timeout_s: float) -> None:
        """Take every worker's latest heartbeat from a read of the monitor's records;
        a worker takes work when :meth:`~switchyard.cluster.WorkerRecord.takes_work`
        says so, and a worker no longer listed is forgotten."""
        present = []
        for record in view.workers:
            if record.heartbeat is None:
                continue
            present.append(record.worker_id)
            self.observe(record.heartbeat, alive=record.takes_work(worker_timeout_s))
        self.forget_missing(present)

    def worker_type(self, worker_id: str, model: str) -> str:
        """The worker type under which ``worker_id`` serves ``model`` (prediction key)."""
        return llm_worker_type(self._heartbeats[worker_id], model)

    def mark_down(self, worker_id: str) -> None:
        self._alive[worker_id] = False

    def forget_missing(self, present: Iterable[str]) -> None:
        """Drop workers the monitor no longer lists."""
        keep = set(present)
        for worker_id in [w for w in self._heartbeats if w not in keep]:
            self._heartbeats.pop(worker_id, None)
            self._alive.pop(worker_id, None)
            self._pending.pop(worker_id, None)
            self._prefixes.pop(worker_id, None)
        for key in [k for k in self._views if k[0] not in keep]:
            del self._views[key]

    def cluster(
        self, model: str, now_s: float, exclude: frozenset[str] = frozenset()
    ) -> ClusterSnapshot:
        """The snapshot of the workers that serve ``model``, with local accounting added."""
        views = []
        for worker_id in sorted(self._heartbeats):
            heartbeat = self._heartbeats[worker_id]
            if model not in heartbeat.servable_models or worker_id in exclude:
                continue
            # A worker that names no inbox partition cannot be sent anything.
            alive = self._alive.get(worker_id, False) and heartbeat.inbox_partition is not None
            built = self._views.get((worker_id, model))
            if built is not None and built[0] is heartbeat and built[1] == alive:
                view = built[2]
            else:
                view = llm_worker_view(heartbeat, model, alive=alive)
                self._views[worker_id, model] = (heartbeat, alive, view)
            pending = self._pending.get(worker_id)
            views.append(view if pending is None else pending.applied_to(view))
        return ClusterSnapshot(now_s=now_s, workers=tuple(views))

    def inbox_partition(self, worker_id: str) -> int | None:
        """Where ``worker_id`` reads its assignments (from its last heartbeat)."""
        heartbeat = self._heartbeats.get(worker_id)
        return None if heartbeat is None else heartbeat.inbox_partition

    def refusal(self, request: InferenceRequest, now_s: float) -> Refusal | None:
        """The policy's admission's answer for a new ``request`` (None: take it; always
        None for a policy without admission). Asked before anything is recorded."""
        admission = self.policy.admission
        if admission is None:
            return None
        view = request_view(request_facts(request), None)
        cluster = prefill_pool(self.cluster(view.model, now_s, frozenset()))
        blocks = _prefix_blocks(request)
        if blocks:
            view = replace(view, cached_tokens=self._cached_tokens(blocks, view.prompt_tokens))
        return admission.admit(view, cluster)

    def place(
        self, request: InferenceRequest, now_s: float, exclude: frozenset[str] = frozenset()
    ) -> Placed:
        """The worker for ``request``; accounts for it until that worker's next heartbeat.

        Raises:
            NoWorkerError: no live worker serves the request's model.
        """
        facts = request_facts(request)
        prediction = predict(facts, self.predictor, self.policy.prediction)
        view = request_view(facts, prediction)
        whole = self.cluster(view.model, now_s, exclude)
        cluster = prefill_pool(whole)
        if not cluster.eligible():
            raise NoWorkerError(f"no live worker serves model {view.model!r}")
        blocks = _prefix_blocks(request) if self.policy.reads_cached_tokens else []
        if blocks:
            view = replace(view, cached_tokens=self._cached_tokens(blocks, view.prompt_tokens))
        placement = self.policy.assignment.assign(view, cluster, self._context())
        self._account(placement.worker_id, view)
        if blocks:
            self._sent_prefix(placement.worker_id, blocks)
        worker_type = self.worker_type(placement.worker_id, view.model)
        return Placed(
            placement,
            view,
            worker_type,
            view.calibrated_s.get(worker_type),
            view.predicted_s.get(worker_type),
            self._decode_target(view, placement.worker_id, whole, cluster),
        )

    def _decode_target(
        self,
        view: RequestView,
        prefill_worker_id: str,
        whole: ClusterSnapshot,
        entry: ClusterSnapshot,
    ) -> DecodeTarget | None:
        """Where a request placed on ``prefill_worker_id`` is decoded, and its
        predictions there (None: there, on a mixed worker or without a live decode
        worker)."""
        if entry is whole:
            return None  # no decode pool (prefill_pool cut nothing): the usual case
        chosen = next(w for w in entry.workers if w.worker_id == prefill_worker_id)
        if chosen.role is not WorkerRole.PREFILL:
            return None
        pool = decode_pool(whole)
        if not pool.eligible():
            return None
        # Its KV cache moves with the prompt and the first token.
        kv_tokens = view.prompt_tokens + 1
        decode = place_decode(
            self.policy.assignment, view, kv_tokens, whole, self._context(), pool
        ).worker_id
        partition = self.inbox_partition(decode)
        if decode == prefill_worker_id or partition is None:
            return None
        self._account(decode, view)
        worker_type = self.worker_type(decode, view.model)
        return DecodeTarget(
            worker_id=decode,
            inbox_partition=partition,
            predicted_s=view.calibrated_s.get(worker_type),
            predicted_raw_s=view.predicted_s.get(worker_type),
        )

    def _context(self) -> DecisionContext:
        ctx = DecisionContext(self._rng, self._sequence)
        self._sequence += 1
        return ctx

    def _account(self, worker_id: str, view: RequestView) -> None:
        heartbeat = self._heartbeats[worker_id]
        pending = self._pending.get(worker_id)
        if pending is None:
            pending = self._pending[worker_id] = SentSinceHeartbeat(
                since_sent_at_s=heartbeat.sent_at_s
            )
        worker_type = llm_worker_type(heartbeat, view.model)
        pending.add(view.calibrated_s.get(worker_type, 0.0), view.prompt_tokens)

    def _cached_tokens(self, blocks: list[int], prompt_tokens: int) -> dict[str, int]:
        """Per worker, the prompt tokens it should hold, by what was sent there."""
        found = {}
        for worker_id, index in self._prefixes.items():
            matched = index.matched_blocks(blocks)
            if matched:
                found[worker_id] = cached_tokens(matched, prompt_tokens)
        return found

    def _sent_prefix(self, worker_id: str, blocks: list[int]) -> None:
        index = self._prefixes.get(worker_id)
        if index is None:
            capacity_tokens = self._heartbeats[worker_id].kv_capacity_tokens
            index = self._prefixes[worker_id] = PrefixCache(capacity_tokens // PREFIX_BLOCK_TOKENS)
        index.use(blocks)


def _prefix_blocks(request: InferenceRequest) -> list[int]:
    payload = request.payload
    return payload.prefix_blocks if isinstance(payload, LLMPayload) else []
