"""Admission policies: refuse, before it takes any capacity, a request that cannot meet
its objective wherever it runs.

:class:`TtftFeasible` (``ttft-feasible``) refuses a request whose time-to-first-token
objective no eligible worker can meet even idle: its prefill compute alone, past the
prefix the worker's cache already holds (``RequestView.cached_tokens``), takes longer
than the objective times ``slack``. Such a request is late whatever the scheduler does,
and its long prefill (a 15,000-token prompt takes 1.4 s of an A100's time) pauses every
decode on its worker meanwhile, so serving it costs requests that could be on time. The
judgement leaves out the wait for the prefills queued ahead and the profile's fixed
per-iteration cost (about 10 ms, once per chunk on a worker that prefills in chunks):
it refuses only what is certain to be late and errs towards admitting. (Counting each
chunk's iteration was tried: with 2,048-token chunks it raised the code trace's capacity
at 90 % by 8 % and cost the Mooncake trace its 90 % capacity, likely because a prefix
cached between admission and prefill makes the count too long; docs/benchmarks.md.)
A request without a TTFT objective, or on a worker whose profile does not say how long
a prefill takes, is admitted.

Refused requests count as misses in every figure (:mod:`switchyard.slo`): admission
raises goodput only by what the capacity it spares buys the requests that are left.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.policies.base import AdmissionPolicy, Refusal
from switchyard.policies.snapshot import ClusterSnapshot, RequestView

__all__ = ["ADMISSION_POLICIES", "TtftFeasible", "make_admission"]


@dataclass(frozen=True, slots=True)
class TtftFeasible:
    """Refuse a request whose TTFT objective no worker can meet even idle."""

    name: str = "ttft-feasible"
    slack: float = 1.0
    """The objective is judged times this (above 1: refuse fewer, only the hopeless)."""

    def __post_init__(self) -> None:
        if not self.slack > 0:
            raise ValueError(f"slack must be > 0, got {self.slack!r}")

    def admit(self, request: RequestView, cluster: ClusterSnapshot) -> Refusal | None:
        objective_s = request.ttft_slo_s
        if objective_s is None:
            return None
        limit_s = objective_s * self.slack
        prompt = request.prompt_tokens
        cached = request.cached_tokens
        best_s: float | None = None
        for worker in cluster.eligible():
            if worker.prefill_per_token_s <= 0.0:
                return None  # a worker whose prefill is not known: give it the benefit
            prefill_s = worker.prefill_compute_s(prompt, cached.get(worker.worker_id, 0))
            if prefill_s <= limit_s:
                return None
            if best_s is None or prefill_s < best_s:
                best_s = prefill_s
        if best_s is None:
            return None  # no eligible worker: assignment reports that, not admission
        return Refusal(
            f"its prefill takes at least {best_s:.2f} s on any worker, past its "
            f"{objective_s:g} s time-to-first-token objective"
        )


ADMISSION_POLICIES: dict[str, type[TtftFeasible]] = {"ttft-feasible": TtftFeasible}
"""Admission policies by name (``none``: take every request)."""


def make_admission(name: str) -> AdmissionPolicy | None:
    """The admission policy registered as ``name``; None for ``none``.

    Raises:
        ValueError: naming ``name`` and the known ones.
    """
    if name == "none":
        return None
    try:
        return ADMISSION_POLICIES[name]()
    except KeyError:
        known = ", ".join(["none", *ADMISSION_POLICIES])
        raise ValueError(f"unknown admission policy {name!r}: known are {known}") from None
