"""The predictor service: a service-time prediction for every LLM request, learning online.

Consumes ``switchyard.requests`` in batches (group ``predictor``) and publishes one
:class:`ServiceTimePrediction` per LLM request to ``switchyard.predictions``; it also
writes ``prediction:{request id}`` to the state store, so a scheduler replica that did
not receive the message, and the rebalancer, can read it. Consumes
``switchyard.completions`` (group ``predictor-learn``) to update the model and the
calibration.

A prediction is advisory: the scheduler decides without one after
``SWITCHYARD_PREDICTION_WAIT_S``, so predictions are sent without waiting for each
broker acknowledgement in turn (the batch's are awaited together).

Metrics: ``switchyard.predictor.predictions`` (counter, predictions published);
``switchyard.predictor.error`` (histogram, seconds: ``|actual - predicted|`` of each
completion learnt from, by ``worker_type``); ``switchyard.predictor.mape`` (observable
gauge, a fraction: the calibration's running mean absolute percentage error, by
``worker_type``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from opentelemetry.metrics import Observation
from switchyard import __version__
from switchyard.contracts.messages import Completion
from switchyard.contracts.topics import COMPLETIONS, PREDICTIONS, REQUESTS
from switchyard.runtime import Service, ServiceContext
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import observe

from services.predictor.model import LivePredictor

PREDICTION_TTL_S = 600.0
_BATCH = 256
_BATCH_WAIT_S = 0.2
_SCOPE = "switchyard.predictor"


def prediction_key(request_id: str) -> str:
    """The state key of a request's prediction."""
    return f"prediction:{request_id}"


class PredictorService(Service):
    """Predicts each LLM request's service time per worker type; see the module docstring."""

    def __init__(self, ctx: ServiceContext, predictor: LivePredictor) -> None:
        super().__init__(ctx)
        self.predictor = predictor
        self.predicted = 0
        meter = ctx.telemetry.meter_provider.get_meter(_SCOPE, __version__)
        self._m_predictions = meter.create_counter(
            "switchyard.predictor.predictions",
            unit="{prediction}",
            description="Service-time predictions published.",
        )
        self._m_error_s = meter.create_histogram(
            "switchyard.predictor.error",
            unit="s",
            description="Absolute error of the raw prediction of each completion learnt from.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        observe(
            ctx.telemetry.meter_provider,
            _SCOPE,
            "switchyard.predictor.mape",
            self._observe_mape,
            unit="1",
            description="Running mean absolute percentage error (a fraction), by worker type.",
        )

    def _observe_mape(self) -> Iterable[Observation]:
        return [
            Observation(state.mape, {"worker_type": worker_type})
            for worker_type, state in self.predictor.calibration_states().items()
            if state.mape_observations
        ]

    async def start(self) -> None:
        self.spawn_routine("predict", self._predict_routine)
        self.spawn_routine("learn", self._learn_routine)

    async def _predict_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(REQUESTS, group="predictor", stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                batch = await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
                if not batch:
                    continue
                sends = []
                writes = []
                now_s = time.time()
                for delivery in batch:
                    with sub.handling(delivery):
                        prediction = self.predictor.predict(delivery.message, now_s)
                        if prediction is None:
                            continue
                        sends.append(await ctx.bus.send(PREDICTIONS, prediction))
                    writes.append(
                        ctx.state.set(
                            prediction_key(prediction.request_id),
                            prediction.model_dump_json(),
                            ttl_s=PREDICTION_TTL_S,
                        )
                    )
                await asyncio.gather(*sends, *writes)
                self.predicted += len(sends)
                if sends:
                    self._m_predictions.add(len(sends))

    async def _learn_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(
            COMPLETIONS, group="predictor-learn", stopping=ctx.stopping
        ) as sub:
            while not ctx.stopping.is_set():
                for delivery in await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S):
                    self._learn(delivery.message)

    def _learn(self, completion: Completion) -> None:
        predictor = self.predictor
        before = predictor.last_error
        learnt = predictor.learn(completion)
        error = predictor.last_error
        if learnt and error is not None and error is not before:
            worker_type, error_s = error
            self._m_error_s.record(error_s, {"worker_type": worker_type})


async def create(ctx: ServiceContext) -> Service:
    """The predictor service, pre-trained for ``SWITCHYARD_WORKER_TIME_SCALE``."""
    predictor = await asyncio.to_thread(LivePredictor.pretrained, ctx.settings.worker_time_scale)
    return PredictorService(ctx, predictor)
