"""The simulator's heartbeat option (``SimulationConfig.heartbeat_s``): policies decide
on each worker as its last heartbeat showed it, plus what was sent to it since, as the
live placer does (:class:`~switchyard.policies.sent_since_heartbeat.SentSinceHeartbeat`),
instead of on every worker's state at that instant.

Each worker beats every ``heartbeat_s`` seconds of simulated time, the workers' beats
spread evenly over the period (worker ``i`` of ``n`` first at ``(i + 1) / n`` of it
after the first arrival), as independent live workers' do. The state a beat reports is
the worker's as of its last change, which is what a live worker's heartbeat lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from switchyard.policies.sent_since_heartbeat import SentSinceHeartbeat
from switchyard.policies.snapshot import WorkerView

__all__ = ["HeardCluster"]


class HeardCluster:
    """Every worker's last heartbeat and what was sent to it since, by worker index."""

    def __init__(self, views: Sequence[WorkerView]) -> None:
        self._heard = list(views)
        self._heard_at_s = [0.0] * len(views)
        self._sent: list[SentSinceHeartbeat | None] = [None] * len(views)
        self._workers: tuple[WorkerView, ...] | None = None

    def beat(self, index: int, view: WorkerView, now_s: float) -> None:
        """Worker ``index`` reported ``view``: it covers everything sent before."""
        self._heard[index] = view
        self._heard_at_s[index] = now_s
        self._sent[index] = None
        self._workers = None

    def sent(self, index: int, request_work_s: Mapping[str, float], prompt_tokens: int) -> None:
        """A request was sent to worker ``index``, with its calibrated predictions by
        worker type (the worker counts the one for its own type)."""
        sent = self._sent[index]
        if sent is None:
            sent = self._sent[index] = SentSinceHeartbeat(since_sent_at_s=self._heard_at_s[index])
        sent.add(request_work_s.get(self._heard[index].worker_type, 0.0), prompt_tokens)
        self._workers = None

    def workers(self) -> tuple[WorkerView, ...]:
        """The views a policy decides on."""
        if self._workers is None:
            self._workers = tuple(
                view if sent is None else sent.applied_to(view)
                for view, sent in zip(self._heard, self._sent, strict=True)
            )
        return self._workers
