"""Scheduling policies: pure, synchronous decisions over frozen snapshots.

``snapshot`` holds the views, ``base`` the Protocols and decisions, one module per
policy family, and ``registry`` every LLM policy by name.
"""

from switchyard.policies.base import (
    AssignmentPolicy,
    DecisionContext,
    DecodeRouter,
    MigrationPlan,
    NoWorkerError,
    Placement,
    RebalancePolicy,
)
from switchyard.policies.registry import (
    LlmPolicy,
    PolicyOptions,
    PredictionUse,
    UnknownPolicyError,
    llm_policy_names,
    make_llm_policy,
)
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueuedRequestView,
    QueueScope,
    RebalanceSnapshot,
    RequestPhase,
    RequestView,
    WorkerRole,
    WorkerView,
)

__all__ = [
    "AssignmentPolicy",
    "ClusterSnapshot",
    "DecisionContext",
    "DecodeRouter",
    "LlmPolicy",
    "MigrationPlan",
    "NoWorkerError",
    "Placement",
    "PolicyOptions",
    "PredictionUse",
    "QueueScope",
    "QueuedRequestView",
    "RebalancePolicy",
    "RebalanceSnapshot",
    "RequestPhase",
    "RequestView",
    "UnknownPolicyError",
    "WorkerRole",
    "WorkerView",
    "llm_policy_names",
    "make_llm_policy",
]
