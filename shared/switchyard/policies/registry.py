"""Every LLM scheduling policy by name: one line each, shared by the simulator and the
live scheduler and rebalancer.

A named policy is a bundle: an assignment policy, an optional rebalancer, an optional
admission policy (asked first, it may refuse a request outright), the
prediction it reads (none, the calibrated predictor, one constant for every request, or
the true service time), and the worker pools it needs (stage-aware routers split the
cluster into prefill and decode workers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from switchyard.policies.admission import TtftFeasible, make_admission
from switchyard.policies.assignment import (
    JoinShortestQueue,
    LeastPredictedWork,
    LeastWorkPlusService,
    PowerOfTwoChoices,
    RandomChoice,
    RoundRobin,
)
from switchyard.policies.base import AdmissionPolicy, AssignmentPolicy, RebalancePolicy
from switchyard.policies.cache_aware import CacheAwareRouter
from switchyard.policies.flashgen import FlashGenRouter
from switchyard.policies.gaps import (
    GapsAssignment,
    GapsAssignmentConfig,
    GapsRebalanceConfig,
    GapsRebalancer,
)
from switchyard.policies.llumnix import LlumnixAssignment, LlumnixRebalancer
from switchyard.policies.prefix_aware import EndpointPicker, KvRouter
from switchyard.policies.splitwise import SplitwiseRouter


class PredictionUse(StrEnum):
    """What the shell must put into ``RequestView.predicted_s`` / ``calibrated_s``."""

    NONE = "none"
    """Nothing: the policy reads no prediction (the shell may skip predicting)."""
    CALIBRATED = "calibrated"
    """The service-time predictor's ``s^`` and the calibrated ``s~``."""
    CONSTANT = "constant"
    """One figure for every request (the predictor's training mean): no per-request view."""
    EXACT = "exact"
    """The true service time: clairvoyant, for reference policies only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyOptions:
    """Tunables a caller may override; defaults are the documented ones."""

    gaps: GapsAssignmentConfig = field(default_factory=GapsAssignmentConfig)
    gaps_rebalance: GapsRebalanceConfig = field(default_factory=GapsRebalanceConfig)
    prefill_fraction: float = 0.25
    admission: str | None = None
    """An admission policy every policy runs with (``none``: none), in place of its own:
    admission as a cluster option, to tell a policy's routing apart from its admission."""

    def __post_init__(self) -> None:
        if self.admission is not None:
            make_admission(self.admission)  # a bad name fails here, naming the known ones


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmPolicy:
    """A named scheduling policy as the shells run it."""

    name: str
    summary: str
    assignment: AssignmentPolicy
    rebalancer: RebalancePolicy | None = None
    prediction: PredictionUse = PredictionUse.NONE
    prefill_fraction: float | None = None
    """Set for stage-aware policies: the share of workers in the prefill pool."""
    reference: bool = False
    """A reference (the oracle), reported but not a contender."""
    prefix_aware: bool = False
    """It reads ``RequestView.cached_tokens``: the shell must fill them (others skip it)."""
    admission: AdmissionPolicy | None = None
    """Asked before assignment; None: every request is taken."""

    @property
    def reads_cached_tokens(self) -> bool:
        """Whether the shell must fill ``RequestView.cached_tokens`` for it."""
        return self.prefix_aware or self.admission is not None


class UnknownPolicyError(ValueError):
    """A policy name that is not registered; the message lists the known ones."""


def _gaps(o: PolicyOptions) -> LlmPolicy:
    return LlmPolicy(
        name="gaps",
        summary="hybrid JSQ / least predicted work + s~, selective cost-aware rebalancing",
        assignment=GapsAssignment(o.gaps),
        rebalancer=GapsRebalancer(o.gaps_rebalance),
        prediction=PredictionUse.CALIBRATED,
    )


def _switchyard(o: PolicyOptions) -> LlmPolicy:
    return LlmPolicy(
        name="switchyard",
        summary="soonest first token with cache hits counted, least pause to running "
        "decodes; refuses what no worker can start in time",
        assignment=CacheAwareRouter(),
        prefix_aware=True,
        admission=TtftFeasible(),
    )


def _gaps_nopred(o: PolicyOptions) -> LlmPolicy:
    return LlmPolicy(
        name="gaps-nopred",
        summary="GAPS with one constant service time for every request",
        assignment=GapsAssignment(o.gaps, name="gaps-nopred"),
        rebalancer=GapsRebalancer(o.gaps_rebalance),
        prediction=PredictionUse.CONSTANT,
    )


def _gaps_norebal(o: PolicyOptions) -> LlmPolicy:
    return LlmPolicy(
        name="gaps-norebal",
        summary="GAPS assignment, no rebalancing",
        assignment=GapsAssignment(o.gaps, name="gaps-norebal"),
        prediction=PredictionUse.CALIBRATED,
    )


def _gaps_noglobal(o: PolicyOptions) -> LlmPolicy:
    config = GapsAssignmentConfig(
        utilization_threshold=o.gaps.utilization_threshold, use_global_work=False
    )
    return LlmPolicy(
        name="gaps-noglobal",
        summary="GAPS without the global predicted-work view: JSQ plus rebalancing",
        assignment=GapsAssignment(config, name="gaps-noglobal"),
        rebalancer=GapsRebalancer(o.gaps_rebalance),
        prediction=PredictionUse.CALIBRATED,
    )


def _oracle(o: PolicyOptions) -> LlmPolicy:
    return LlmPolicy(
        name="oracle",
        summary="clairvoyant reference: least true work + true service time, exact rebalancing",
        assignment=LeastWorkPlusService(),
        rebalancer=GapsRebalancer(o.gaps_rebalance),
        prediction=PredictionUse.EXACT,
        reference=True,
    )


def _splitwise(o: PolicyOptions) -> LlmPolicy:
    return LlmPolicy(
        name="splitwise",
        summary="stage-aware: prefill pool by shortest queue, decode pool by lowest memory",
        assignment=SplitwiseRouter(o.prefill_fraction),
        prefill_fraction=o.prefill_fraction,
    )


def _simple(
    name: str, summary: str, make: Callable[[], AssignmentPolicy]
) -> Callable[[PolicyOptions], LlmPolicy]:
    def build(o: PolicyOptions) -> LlmPolicy:
        return LlmPolicy(name=name, summary=summary, assignment=make())

    return build


_REGISTRY: dict[str, Callable[[PolicyOptions], LlmPolicy]] = {
    "round-robin": _simple("round-robin", "next worker in turn", RoundRobin),
    "random": _simple("random", "uniformly random worker", RandomChoice),
    "jsq": _simple("jsq", "join the shortest queue (requests outstanding)", JoinShortestQueue),
    "power-of-two": _simple(
        "power-of-two", "shorter queue of two random workers", PowerOfTwoChoices
    ),
    "least-work": lambda o: LlmPolicy(
        name="least-work",
        summary="least predicted queued work",
        assignment=LeastPredictedWork(),
        prediction=PredictionUse.CALIBRATED,
    ),
    "llumnix": lambda o: LlmPolicy(
        name="llumnix",
        summary="lowest KV usage, periodic live migration from most to least loaded",
        assignment=LlumnixAssignment(),
        rebalancer=LlumnixRebalancer(),
    ),
    "llm-d": lambda o: LlmPolicy(
        name="llm-d",
        summary="llm-d's endpoint picker: queue, KV utilisation and prefix hits",
        assignment=EndpointPicker(),
        prefix_aware=True,
    ),
    "kv-router": lambda o: LlmPolicy(
        name="kv-router",
        summary="Dynamo's KV router: prefill blocks not cached plus active blocks",
        assignment=KvRouter(),
        prefix_aware=True,
    ),
    "splitwise": _splitwise,
    "flashgen": _simple("flashgen", "local: fastest decode step once joined", FlashGenRouter),
    "gaps": _gaps,
    "gaps-nopred": _gaps_nopred,
    "gaps-norebal": _gaps_norebal,
    "gaps-noglobal": _gaps_noglobal,
    "oracle": _oracle,
    "switchyard": _switchyard,
}


def llm_policy_names() -> list[str]:
    """Registered names, in the order tables list them."""
    return list(_REGISTRY)


def make_llm_policy(name: str, options: PolicyOptions | None = None) -> LlmPolicy:
    """The policy registered as ``name``.

    Raises:
        UnknownPolicyError: naming ``name`` and every known policy.
    """
    try:
        build = _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy {name!r}: known policies are {', '.join(_REGISTRY)}"
        ) from None
    options = options or PolicyOptions()
    policy = build(options)
    if options.admission is not None:
        policy = replace(policy, admission=make_admission(options.admission))
    return policy
