"""The request-by-request baselines: MaxAcc-EDF, LO-EDF and LO-Priority.

Each orders the window's requests, then decides them one at a time:

* ``maxacc-edf``: earliest deadline first; every request gets the variant it believes
  most accurate (ties: the one that would finish first, then the first listed).
* ``lo-edf``: earliest deadline first; every request gets its *locally optimal* variant,
  the one with the highest expected utility for that request given when and where it
  would run now, a swap included (ties: earlier finish, then first listed).
* ``lo-priority``: as ``lo-edf``, ordered by
  :func:`~switchyard.selection.base.priority`, highest first.

Batching, the same for all three: a request joins the last batch of a worker when that
batch runs the same (application, variant), otherwise it opens a new batch there; each
request goes to the worker where it would finish earliest (list scheduling, see
:mod:`~switchyard.selection.timeline`). Joining grows the batch, which can delay the
requests already in it; the final plan is scored with their real end times.

The ``-da`` (data-aware) forms ask the shell for SneakPeek estimates and believe them;
the data-oblivious forms drop any estimate a request carries and use profiled accuracy
only (for the variant choice and for the priority).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from switchyard.policies.base import DecisionContext
from switchyard.selection.base import WindowPlan, priority
from switchyard.selection.snapshot import VariantView, WindowRequest, WindowSnapshot
from switchyard.selection.timeline import (
    Option,
    Timeline,
    estimated_accuracy,
    profiled_accuracy,
    validate_requests,
    without_estimates,
)

__all__ = ["ChoiceKind", "OrderKind", "SequentialScheduler"]

OrderKind = Literal["deadline", "priority"]
ChoiceKind = Literal["max-accuracy", "locally-optimal"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SequentialScheduler:
    """One request at a time, in ``order``, with the variant ``choice`` picks.

    Example:
        >>> lo_edf = SequentialScheduler(
        ...     name="lo-edf", data_aware=False, order="deadline", choice="locally-optimal"
        ... )
    """

    name: str
    data_aware: bool
    order: OrderKind
    choice: ChoiceKind

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        """Plan the window; see the module docstring. ``ctx`` is not used (deterministic)."""
        del ctx
        valid, rejected = validate_requests(snapshot, use_estimates=self.data_aware)
        accuracy = estimated_accuracy if self.data_aware else profiled_accuracy
        if not self.data_aware:
            valid = without_estimates(valid)
        timeline = Timeline(snapshot, accuracy)
        for request in self._ordered(valid, snapshot):
            app = snapshot.apps[request.app]
            best: tuple[tuple[float, float], VariantView, Option] | None = None
            for variant in app.variants:
                option = timeline.option(app, variant, 1, merge=True)
                if option is None:
                    continue
                if self.choice == "max-accuracy":
                    value = accuracy(request, variant)
                else:
                    value = timeline.utility(request, variant, option.end_s)
                score = (value, -option.end_s)
                if best is None or score > best[0]:
                    best = (score, variant, option)
            # validate_requests guarantees some variant runs on some worker
            assert best is not None
            timeline.commit(best[2], app, best[1], (request,))
        return timeline.result().to_plan(rejected)

    def _ordered(
        self, requests: Sequence[WindowRequest], snapshot: WindowSnapshot
    ) -> list[WindowRequest]:
        indexed = list(enumerate(requests))
        if self.order == "deadline":
            indexed.sort(key=lambda p: (p[1].deadline_s, p[1].arrival_s, p[0]))
        else:
            now_s = snapshot.now_s
            keys = {
                i: (-priority(r, snapshot.apps[r.app], now_s), r.deadline_s, i) for i, r in indexed
            }
            indexed.sort(key=lambda p: keys[p[0]])
        return [r for _, r in indexed]
