"""A request's life as a state machine with atomic transitions (the request ledger).

:class:`RequestLedger` is the one module that changes ``request:{id}`` records and the
workers' assigned sets; :class:`RequestRecord` is what a reader gets back.
"""

from switchyard.lifecycle.ledger import (
    CANCELLED_BY_CLIENT,
    RECENT_WINDOW,
    Accepted,
    Assign,
    AssignOutcome,
    CancelResult,
    Fence,
    FinishResult,
    RequestLedger,
    StartResult,
    acceptance_fields,
    completion_violated,
)
from switchyard.lifecycle.record import (
    FINAL_STATUSES,
    REQUEST_TTL_S,
    RequestRecord,
    RequestStatus,
)

__all__ = [
    "CANCELLED_BY_CLIENT",
    "FINAL_STATUSES",
    "RECENT_WINDOW",
    "REQUEST_TTL_S",
    "Accepted",
    "Assign",
    "AssignOutcome",
    "CancelResult",
    "Fence",
    "FinishResult",
    "RequestLedger",
    "RequestRecord",
    "RequestStatus",
    "StartResult",
    "acceptance_fields",
    "completion_violated",
]
