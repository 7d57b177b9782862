"""LLM stages in the multi-model simulator: each LLM application's workers, simulated as
the LLM simulator's instances, and the registered LLM policy placing each stage.

A pipeline's LLM stage (:class:`~switchyard.multimodel.model.LlmStage`) is a completion
of its ``output_tokens`` on a prompt of the call's input and the outputs of the LLM
stages it runs after (:meth:`~switchyard.multimodel.model.PipelineSpec.llm_prompt_tokens`),
as the live stack sends it to the LLM workers. Those workers are
:class:`~research.llm.instance.SimInstance` objects, the same continuous batching over a
performance model as ``switchyard simulate`` (and as the emulated LLM worker), and the
stage is placed among its application's workers by ``assignment.assign`` of the LLM
policy registered under the configured name, over a snapshot of those workers alone.
Placement never loads or evicts them: an application has the workers it is given.

Simplified against the live stack:

- *Predictions.* A policy that reads them is given each stage's idle service time on each
  worker type, exact (the live stack's predictor is trained on what it saw).
- *No rebalancing or admission* of LLM stages: no stage migrates, none is refused.
- *No prefix cache.* A stage's prompt carries no KV-block ids, so a worker prefills every
  prompt in full; the live worker spares the blocks it holds (a verifier's prompt and the
  revision's share the input and the draft).
- *No control plane.* A stage reaches its worker the instant it is ready.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from switchyard.contracts.fields import WorkloadType
from switchyard.perf import performance_model
from switchyard.perf.profiles import UnknownProfileError
from switchyard.policies.base import DecisionContext
from switchyard.policies.registry import PredictionUse, UnknownPolicyError, make_llm_policy
from switchyard.policies.snapshot import WorkerRole
from switchyard.policies.view_builders import new_cluster_snapshot, new_request_view

from research.llm.instance import SimInstance, worker_view
from research.llm.request import SimRequest
from research.multimodel.errors import RoutingError, SimulationInputError

__all__ = ["LlmStagePool", "LlmWorkers"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LlmWorkers:
    """The LLM workers of one LLM application (what an LLM stage names as ``model``).

    ``profiles``: one performance-model profile per worker (``"a100-80gb/llama-2-13b"``,
    see ``switchyard simulate --list-profiles``); ``workload``: the workload class its
    requests are predicted as."""

    application: str
    profiles: tuple[str, ...]
    workload: WorkloadType = WorkloadType.CONVERSATION


class LlmStagePool(Generic[T]):
    """The LLM workers of a multi-model run. Only the simulator calls it: it hands in a
    stage with ``submit`` and the ``payload`` that names it, wakes an instance at the
    time ``reschedule`` gave, and gets back the payloads of the stages that finished.

    Raises (``__init__``):
        SimulationInputError: an unknown policy or profile, an application twice or
            with no workers.
    """

    def __init__(self, groups: Sequence[LlmWorkers], policy: str, seed: int) -> None:
        try:
            self.policy = make_llm_policy(policy)
        except UnknownPolicyError as exc:
            raise SimulationInputError(f"LLM stages: {exc}") from None
        self._groups: dict[str, tuple[LlmWorkers, list[SimInstance]]] = {}
        self._by_id: dict[str, SimInstance] = {}
        for group in groups:
            if group.application in self._groups:
                raise SimulationInputError(
                    f"LLM application {group.application!r} is given workers twice"
                )
            if not group.profiles:
                raise SimulationInputError(f"LLM application {group.application!r} has no workers")
            instances = []
            for i, profile in enumerate(group.profiles):
                try:
                    perf = performance_model(profile)
                except UnknownProfileError as exc:
                    raise SimulationInputError(
                        f"LLM application {group.application!r}: {exc}"
                    ) from None
                inst = SimInstance(
                    len(self._by_id), f"{group.application}/{i}", perf, WorkerRole.MIXED
                )
                instances.append(inst)
                self._by_id[inst.worker_id] = inst
            self._groups[group.application] = (group, instances)
        self._rng = random.Random(f"llm-stages:{seed}")
        self._sequence = 0
        self._payloads: dict[int, T] = {}
        self._next_index = 0

    @property
    def applications(self) -> frozenset[str]:
        return frozenset(self._groups)

    @property
    def instances(self) -> Iterable[SimInstance]:
        return self._by_id.values()

    def submit(
        self,
        application: str,
        payload: T,
        *,
        prompt_tokens: int,
        output_tokens: int,
        slo_s: float,
        now_s: float,
    ) -> SimInstance:
        """Place one stage on a worker of ``application`` and queue it there; the caller
        then calls :meth:`reschedule` for the returned instance.

        Raises:
            RoutingError: the policy chose a worker that is not the application's.
        """
        group, instances = self._groups[application]
        predicted: dict[str, float] = {}
        deadline_s: float | None = None
        if self.policy.prediction is not PredictionUse.NONE:
            for inst in instances:
                predicted[inst.worker_type] = inst.perf.idle_service_s(prompt_tokens, output_tokens)
            deadline_s = now_s + min(predicted.values())
        index = self._next_index
        self._next_index += 1
        # RequestView's fields in order (see view_builders).
        view = new_request_view(
            f"s{index}",
            now_s,
            prompt_tokens,
            group.workload,
            application,
            output_tokens,  # output_tokens_hint: a stage asks for exactly this many
            predicted,
            predicted,  # calibrated_s: exact, so no calibration
            deadline_s,
            None,  # true_service_s
            {},  # cached_tokens: no prefix cache here
            None,  # ttft_slo_s: a stage's objective is its pipeline's
        )
        request = SimRequest(
            index=index,
            arrival_s=now_s,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            workload=group.workload,
            view=view,
            slo_s=slo_s,
        )
        cluster = new_cluster_snapshot(now_s, tuple(worker_view(i, None) for i in instances))
        ctx = DecisionContext(self._rng, self._sequence)
        self._sequence += 1
        chosen = self.policy.assignment.assign(view, cluster, ctx).worker_id
        found = self._by_id.get(chosen)
        if found is None or found not in instances:
            raise RoutingError(
                f"LLM policy {self.policy.name!r} sent a stage of {application!r} to "
                f"{chosen!r}, which is not one of its workers"
            )
        found.enqueue(request, now_s)
        self._payloads[index] = payload
        return found

    def reschedule(self, inst: SimInstance, now_s: float) -> tuple[float, int] | None:
        """When ``inst`` must next be woken, and the version to wake it with, if that
        changed (``None``: the wake-up already due, or none needed). A wake-up whose
        version is no longer the instance's is stale: :meth:`wake` ignores it."""
        wake_s = inst.next_wake_s(now_s)
        if wake_s == inst.wake_s:
            return None
        inst.wake_s = wake_s
        inst.wake_version += 1
        if wake_s is None:
            return None
        return max(now_s, wake_s), inst.wake_version

    def wake(self, inst: SimInstance, version: int, now_s: float) -> list[T]:
        """Carry ``inst`` forward to ``now_s``; the payloads of the stages that finished."""
        if version != inst.wake_version:
            return []
        inst.wake_s = None
        finished, _ = inst.wake(now_s)
        return [self._payloads.pop(request.index) for request in finished]

    def busy_s(self, end_s: float) -> dict[str, float]:
        """Each worker's seconds with a prefill or a decode step running, up to ``end_s``."""
        for inst in self._by_id.values():
            inst.account(end_s)
        return {inst.worker_id: inst.busy_area for inst in self._by_id.values()}
