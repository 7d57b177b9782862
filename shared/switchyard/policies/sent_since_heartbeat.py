"""A worker as its last heartbeat showed it, plus what was sent to it since.

A live placer sees each worker through its latest heartbeat (every 0.5 s by default,
``SWITCHYARD_HEARTBEAT_INTERVAL_S``), so without its own accounting a burst decided
between two heartbeats would all go to the worker that looked idlest. :class:`SentSinceHeartbeat` is that accounting: every
request sent to the worker since the heartbeat counts as waiting there, with its
predicted work and its prompt tokens, until the next heartbeat replaces the view.

The live placer (:mod:`switchyard.cluster.placer`) and the simulator's heartbeat option
(``SimulationConfig.heartbeat_s``, :mod:`research.llm.heard`) use this one class, so the
simulator can show what a policy loses by deciding on heartbeats instead of on the
workers' state at each instant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from switchyard.policies.snapshot import WorkerView

__all__ = ["SentSinceHeartbeat"]


@dataclass(slots=True)
class SentSinceHeartbeat:
    """What was sent to one worker since the heartbeat sent at ``since_sent_at_s``, and
    the worker's view with it added (built again only after either changed)."""

    since_sent_at_s: float
    waiting: int = 0
    work_s: float = 0.0
    tokens: int = 0
    base: WorkerView | None = None
    view: WorkerView | None = None

    def add(self, work_s: float, tokens: int) -> None:
        """One more request sent: ``work_s`` of predicted work, ``tokens`` of prompt."""
        self.waiting += 1
        self.work_s += work_s
        self.tokens += tokens
        self.view = None

    def applied_to(self, view: WorkerView) -> WorkerView:
        """``view`` (the heartbeat's) with the requests sent since counted as waiting;
        a worker with every batch slot taken is fully utilised once one waits."""
        if self.view is None or self.base is not view:
            self.base = view
            self.view = replace(
                view,
                waiting=view.waiting + self.waiting,
                queued_work_s=view.queued_work_s + self.work_s,
                queued_tokens=view.queued_tokens + self.tokens,
                utilization=1.0
                if self.waiting and view.running >= view.max_slots
                else view.utilization,
            )
        return self.view
