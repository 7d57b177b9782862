"""The predictor service: learns service times from what ran, and publishes its model.

It owns the learning and the calibration, not the per-request predictions: every
``SWITCHYARD_PREDICTOR_PUBLISH_INTERVAL_S`` (when it learnt something since), it
publishes its fitted model (:class:`~switchyard.contracts.messages.PredictorModel`: the
linear weights per worker type and the calibration's running errors, a few kilobytes)
to ``predictor:model`` in the state store, and the scheduler and the rebalancer predict
every request with it in-process
(:class:`~switchyard.prediction.snapshot.FittedPredictor`): no round trip, no wait.

It learns from ``switchyard.observations`` (group ``predictor``): each worker batches
what its finished LLM requests took (with the raw prediction their assignment carried,
for the calibration) into one message per heartbeat interval.

The published model is also its checkpoint: a restarted predictor resumes from it (when
it was trained for the same ``SWITCHYARD_WORKER_TIME_SCALE``) instead of starting over.
Run one replica: a second one would learn from half of the observations and publish its
own model over the first's.

Metrics: ``switchyard.predictor.observations`` (counter, observations learnt from);
``switchyard.predictor.error`` (histogram, seconds: ``|actual - raw prediction|`` of
each observation with a prediction, by ``worker_type``); ``switchyard.predictor.mape``
(observable gauge, a fraction: the calibration's running mean absolute percentage
error, by ``worker_type``); ``switchyard.predictor.model_version`` (observable gauge).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from opentelemetry.metrics import Observation
from pydantic import ValidationError
from switchyard import __version__
from switchyard.bus import Delivery
from switchyard.contracts.messages import PredictorModel, ServiceObservation, ServiceObservations
from switchyard.contracts.topics import OBSERVATIONS
from switchyard.runtime import Service, ServiceContext
from switchyard.state import keys
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import observe

from services.predictor.model import LivePredictor

_BATCH = 256
_BATCH_WAIT_S = 0.2
_SCOPE = "switchyard.predictor"


class PredictorService(Service):
    """Learns and publishes the service-time model; see the module docstring."""

    def __init__(self, ctx: ServiceContext, predictor: LivePredictor, version: int = 0) -> None:
        super().__init__(ctx)
        self.predictor = predictor
        self.version = version
        self.learnt = 0
        self._published_learnt = -1
        meter = ctx.telemetry.meter_provider.get_meter(_SCOPE, __version__)
        self._m_observations = meter.create_counter(
            "switchyard.predictor.observations",
            unit="{request}",
            description="Finished requests learnt from.",
        )
        self._m_error_s = meter.create_histogram(
            "switchyard.predictor.error",
            unit="s",
            description="Absolute error of the raw prediction of each observation learnt from.",
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
        observe(
            ctx.telemetry.meter_provider,
            _SCOPE,
            "switchyard.predictor.model_version",
            self._observe_version,
            unit="1",
            description="Version of the model published last.",
        )

    def _observe_mape(self) -> Iterable[Observation]:
        return [
            Observation(state.mape, {"worker_type": worker_type})
            for worker_type, state in self.predictor.calibration_states().items()
            if state.mape_observations
        ]

    def _observe_version(self) -> Iterable[Observation]:
        return [Observation(self.version)]

    async def start(self) -> None:
        await self.publish()  # the scheduler predicts from the start
        self.spawn_routine("learn", self._learn_routine)
        self.spawn_routine("publish", self._publish_routine)

    async def drain(self) -> None:
        await super().drain()
        if self.learnt != self._published_learnt:
            await self.publish()

    async def publish(self) -> PredictorModel:
        """Write the current model to ``predictor:model``."""
        self.version += 1
        self._published_learnt = self.learnt
        model = self.predictor.snapshot(self.version, time.time())
        await self.ctx.state.set(keys.PREDICTOR_MODEL, model.model_dump_json())
        return model

    async def _publish_routine(self) -> None:
        interval_s = self.ctx.settings.predictor_publish_interval_s
        stopping = self.ctx.stopping
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), interval_s)
            except TimeoutError:
                if self.learnt != self._published_learnt:
                    await self.publish()

    async def _learn_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(OBSERVATIONS, group="predictor", stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                for delivery in await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S):
                    # One report the model cannot learn from is dead-lettered, never the
                    # routine stopped.
                    await sub.handle(delivery, self._learn_report)

    async def _learn_report(self, delivery: Delivery[ServiceObservations]) -> None:
        for observation in delivery.message.observations:
            self._learn(observation)

    def _learn(self, observation: ServiceObservation) -> None:
        predictor = self.predictor
        before = predictor.last_error
        if not predictor.observe(observation):
            return
        self.learnt += 1
        self._m_observations.add(1)
        error = predictor.last_error
        if error is not None and error is not before:
            worker_type, error_s = error
            self._m_error_s.record(error_s, {"worker_type": worker_type})


async def create(ctx: ServiceContext) -> Service:
    """The predictor service: resumed from its last published model when that was trained
    for this ``SWITCHYARD_WORKER_TIME_SCALE``, else pre-trained afresh."""
    time_scale = ctx.settings.worker_time_scale
    text = await ctx.state.get(keys.PREDICTOR_MODEL)
    if text is not None:
        try:
            model = PredictorModel.model_validate_json(text)
        except (ValidationError, ValueError) as exc:
            ctx.logger.warning(
                "the published predictor model is unreadable, starting afresh: %s", exc
            )
        else:
            if model.time_scale == time_scale:
                ctx.logger.info("predictor resumes from its published model %d", model.version)
                return PredictorService(ctx, LivePredictor.from_model(model), model.version)
    predictor = await asyncio.to_thread(LivePredictor.pretrained, time_scale)
    return PredictorService(ctx, predictor)
