"""What one window-simulation run measured: per-request outcomes and their summary.

Every request ends one of three ways (:attr:`RequestOutcome.how`):

``batch``
    answered by a model variant; right when the variant's argmax is the true label;
    finished when its batch ends on the worker.
``short-circuit``
    answered at the end of its window with SneakPeek's own label (``argmax theta``).
``rejected``
    not answered (the scheduler gave a reason); utility 0, counted wrong and late.

A request's utility is ``correct x penalty.factor(finish - deadline)`` (0 or 1 times a
factor in ``[0, 1]``). The summary (:class:`WindowSimResult`) averages over every
request of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from switchyard.stats import quantile

__all__ = ["Outcome", "RequestOutcome", "WindowSimResult", "summarise"]

Outcome = Literal["batch", "short-circuit", "rejected"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestOutcome:
    """One request's fate.

    ``finish_s`` is ``None`` for a rejected request; ``variant`` is the variant that
    answered (``None`` unless ``how == "batch"``); ``reason`` is the rejection's.
    """

    request_id: str
    app: str
    window: int
    label: int
    arrival_s: float
    deadline_s: float
    how: Outcome
    finish_s: float | None
    correct: bool
    utility: float
    variant: str | None = None
    reason: str | None = None

    @property
    def lateness_s(self) -> float | None:
        """``finish - deadline`` (``<= 0`` on time), ``None`` when rejected."""
        return None if self.finish_s is None else self.finish_s - self.deadline_s

    @property
    def late(self) -> bool:
        """Answered after the deadline, or never answered."""
        return self.finish_s is None or self.finish_s > self.deadline_s


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSimResult:
    """One scheduler's run over one workload (a seed).

    Attributes:
        scheduler: the scheduler's name.
        seed: the workload's seed.
        requests: how many requests the run held.
        utility: mean utility per request.
        accuracy: share of requests answered right (rejected ones count as wrong).
        deadline_violation_rate: share answered late or not at all.
        mean_violation_s: mean lateness of the requests answered late (0 if none).
        sched_overhead_p50_s, sched_overhead_p99_s: wall-clock seconds of the
            scheduler's ``schedule`` calls (one per window; the only wall clock read).
        short_circuited, rejected: how many requests ended that way.
        swaps: batches that began with a model swap.
        plan_drift_s: the largest gap between a batch's planned end and its end as
            executed from the profiles (0 for a scheduler whose arithmetic is right).
        outcomes: every request's :class:`RequestOutcome`, in arrival order.
    """

    scheduler: str
    seed: int
    requests: int
    utility: float
    accuracy: float
    deadline_violation_rate: float
    mean_violation_s: float
    sched_overhead_p50_s: float
    sched_overhead_p99_s: float
    short_circuited: int
    rejected: int
    swaps: int
    plan_drift_s: float
    outcomes: tuple[RequestOutcome, ...]

    def metrics(self) -> dict[str, Any]:
        """The summary figures (no outcomes), JSON-ready."""
        return {
            "scheduler": self.scheduler,
            "seed": self.seed,
            "requests": self.requests,
            "utility": self.utility,
            "accuracy": self.accuracy,
            "deadline_violation_rate": self.deadline_violation_rate,
            "mean_violation_s": self.mean_violation_s,
            "sched_overhead_p50_s": self.sched_overhead_p50_s,
            "sched_overhead_p99_s": self.sched_overhead_p99_s,
            "short_circuited": self.short_circuited,
            "rejected": self.rejected,
            "swaps": self.swaps,
            "plan_drift_s": self.plan_drift_s,
        }


def _percentile(samples: Sequence[float], q: float) -> float:
    return quantile(samples, q / 100.0) if samples else 0.0


def summarise(
    scheduler: str,
    seed: int,
    outcomes: Sequence[RequestOutcome],
    overhead_s: Sequence[float],
    *,
    swaps: int = 0,
    plan_drift_s: float = 0.0,
) -> WindowSimResult:
    """Average ``outcomes`` into a :class:`WindowSimResult` (``overhead_s``: one per window)."""
    count = len(outcomes)
    late = [o.lateness_s for o in outcomes if o.finish_s is not None and o.late]
    violations = sum(1 for o in outcomes if o.late)
    return WindowSimResult(
        scheduler=scheduler,
        seed=seed,
        requests=count,
        utility=sum(o.utility for o in outcomes) / count if count else 0.0,
        accuracy=sum(1 for o in outcomes if o.correct) / count if count else 0.0,
        deadline_violation_rate=violations / count if count else 0.0,
        mean_violation_s=sum(x for x in late if x is not None) / len(late) if late else 0.0,
        sched_overhead_p50_s=_percentile(overhead_s, 50.0),
        sched_overhead_p99_s=_percentile(overhead_s, 99.0),
        short_circuited=sum(1 for o in outcomes if o.how == "short-circuit"),
        rejected=sum(1 for o in outcomes if o.how == "rejected"),
        swaps=swaps,
        plan_drift_s=plan_drift_s,
        outcomes=tuple(outcomes),
    )
