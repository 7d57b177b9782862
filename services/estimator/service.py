"""The estimator service: a data-aware accuracy estimate for every classification request.

Off the critical path: the scheduler waits for an estimate at most
``SWITCHYARD_PREDICTION_WAIT_S`` and schedules on profiled accuracy without one. At start
it builds one :class:`~switchyard.estimation.SneakPeekEstimator` per classification
application of the catalogue (a neighbour index over the application's training data);
then it consumes ``switchyard.classification-requests`` in batches (group ``estimator``;
LLM requests travel on a topic of their own, never fetched here), estimates each
application's requests together, and publishes an :class:`AccuracyEstimate` per request
to ``switchyard.estimates`` and to the state store (``estimate:{request id}``).

A request whose features do not fit its application (wrong length) gets no estimate; the
ingress rejects such requests before they reach the bus, and the message contract refuses
features that are not finite as 32-bit floats, so this only guards against other
publishers. A batch whose search fails is narrowed down to the request that causes it,
which is dead-lettered (:meth:`~switchyard.bus.Subscription.handle_batch`).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np
from switchyard.bus import Delivery, Subscription
from switchyard.contracts.messages import AccuracyEstimate, ClassificationPayload, InferenceRequest
from switchyard.contracts.topics import CLASSIFICATION_REQUESTS, ESTIMATES
from switchyard.estimation.estimator import SneakPeekEstimator
from switchyard.runtime import Service, ServiceContext
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.state import keys

ESTIMATE_TTL_S = 600.0
_BATCH = 256
_BATCH_WAIT_S = 0.2
INLINE_BATCH = 16
"""Batches of at most this many requests are estimated on the event loop (measured: a
flat search of 24 rows takes about 0.2 ms, docs/benchmarks.md "SneakPeek estimation")."""


def build_estimators(catalogue: ServingCatalogue) -> dict[str, SneakPeekEstimator]:
    """One estimator per classification application (needs the ``ml`` extra)."""
    from switchyard.estimation.application import estimator_for_application
    from switchyard.estimation.index import NeighbourIndex

    indexes: dict[str, NeighbourIndex] = {}
    return {
        name: estimator_for_application(app.spec, indexes=indexes)
        for name, app in catalogue.classification.items()
    }


def estimate_requests(
    estimators: Mapping[str, SneakPeekEstimator],
    catalogue: ServingCatalogue,
    requests: list[InferenceRequest],
    now_s: float,
) -> list[AccuracyEstimate]:
    """Estimates for the classification requests among ``requests`` (one query per app)."""
    by_app: dict[str, list[tuple[InferenceRequest, list[float]]]] = defaultdict(list)
    for request in requests:
        payload = request.payload
        estimator = estimators.get(request.app)
        app = catalogue.classification.get(request.app)
        if not isinstance(payload, ClassificationPayload) or estimator is None or app is None:
            continue
        if len(payload.features) != app.feature_dim:
            continue
        by_app[request.app].append((request, payload.features))
    estimates: list[AccuracyEstimate] = []
    for app_name, rows in by_app.items():
        estimator = estimators[app_name]
        found = estimator.estimate(np.asarray([features for _, features in rows], dtype=np.float32))
        for position, (request, _) in enumerate(rows):
            estimates.append(
                AccuracyEstimate(
                    request_id=request.request_id,
                    app=app_name,
                    theta=[float(v) for v in found.theta[position]],
                    expected_accuracy={
                        variant: float(np.clip(values[position], 0.0, 1.0))
                        for variant, values in found.expected_accuracy.items()
                    },
                    predicted_label=int(found.predicted_label[position]),
                    neighbours=estimator.k,
                    estimated_at_s=now_s,
                )
            )
    return estimates


class EstimatorService(Service):
    """Estimates classification requests' per-variant accuracy; see the module docstring."""

    def __init__(
        self,
        ctx: ServiceContext,
        catalogue: ServingCatalogue,
        estimators: Mapping[str, SneakPeekEstimator],
    ) -> None:
        super().__init__(ctx)
        self.catalogue = catalogue
        self.estimators = estimators
        self.estimated = 0

    async def start(self) -> None:
        self.spawn_routine("estimate", self._estimate_routine)

    async def _estimate_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(
            CLASSIFICATION_REQUESTS, group="estimator", stopping=ctx.stopping
        ) as sub:
            while not ctx.stopping.is_set():
                batch = await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
                if batch:
                    # A request the search cannot take is dead-lettered, never the routine
                    # stopped: the scheduler decides it on profiled accuracy.
                    await sub.handle_batch(batch, partial(self._estimate_batch, sub))

    async def _estimate_batch(
        self,
        sub: Subscription[InferenceRequest],
        batch: Sequence[Delivery[InferenceRequest]],
    ) -> None:
        requests = [d.message for d in batch]
        if len(requests) <= INLINE_BATCH:
            # A small batch's search takes a fraction of a millisecond: handing it to a
            # thread would cost more (two hand-overs of the interpreter lock, each up to
            # its 5 ms switch interval while the loop is busy).
            estimates = estimate_requests(self.estimators, self.catalogue, requests, time.time())
        else:
            # In a thread: a neighbour search over a large batch would otherwise hold the
            # event loop (the whole process, in the embedded stack).
            estimates = await asyncio.to_thread(
                estimate_requests, self.estimators, self.catalogue, requests, time.time()
            )
        by_id = {d.message.request_id: d for d in batch}
        sends = []
        for estimate in estimates:
            with sub.handling(by_id[estimate.request_id]):
                sends.append(await self.ctx.bus.send(ESTIMATES, estimate))
        writes = [
            self.ctx.state.set(
                keys.estimate(e.request_id), e.model_dump_json(), ttl_s=ESTIMATE_TTL_S
            )
            for e in estimates
        ]
        await asyncio.gather(*sends, *writes)
        self.estimated += len(estimates)


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """The estimator service over ``catalogue`` (loaded from the settings when None)."""
    if catalogue is None:
        from switchyard.serving.artifacts import load_catalogue

        catalogue = await asyncio.to_thread(
            load_catalogue, ctx.settings.registry, ctx.settings.cache_dir
        )
    estimators = await asyncio.to_thread(build_estimators, catalogue)
    return EstimatorService(ctx, catalogue, estimators)
