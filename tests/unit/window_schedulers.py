"""A minimal window scheduler the simulator and command tests share, so that they do not
depend on the real schedulers: every request on its application's most accurate
variant, in arrival order, one batch per request, on the first worker."""

from __future__ import annotations

from switchyard.policies.base import DecisionContext
from switchyard.selection.base import PlannedBatch, WindowPlan, batch_latency_s
from switchyard.selection.snapshot import WindowSnapshot


class MostAccurate:
    """Every request on its application's most accurate variant, in arrival order, one
    batch per request, on the first worker; swaps counted as the contract says."""

    name = "test-most-accurate"
    data_aware = False

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan:
        worker = snapshot.workers[0]
        clock = max(snapshot.now_s, worker.free_at_s)
        loaded = worker.loaded
        batches = []
        for request in sorted(snapshot.requests, key=lambda r: r.arrival_s):
            variant = max(snapshot.apps[request.app].variants, key=lambda v: v.accuracy)
            swap = 0.0 if loaded == (request.app, variant.name) else variant.load_s
            end = clock + swap + batch_latency_s(variant, worker.worker_type, 1)
            batches.append(
                PlannedBatch(
                    worker.worker_id,
                    request.app,
                    variant.name,
                    (request.request_id,),
                    clock,
                    swap,
                    end,
                )
            )
            clock, loaded = end, (request.app, variant.name)
        return WindowPlan(batches=tuple(batches))
