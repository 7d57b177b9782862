"""The worker's metrics (attributes ``worker_id`` and ``emulated`` on each; several
workers of one process, the embedded stack, share the instruments).

* ``switchyard.worker.queue_length``, ``switchyard.worker.running`` (observable gauges):
  requests waiting here, and running;
* ``switchyard.worker.batch.size`` (histogram): requests started together (a static
  batch, or the requests one continuous-batching prefill admitted);
* ``switchyard.worker.execution.duration`` (histogram, seconds): start to finish of a
  request here, by ``model`` and ``status``;
* ``switchyard.worker.completions`` (counter): answers recorded, by ``status``;
* ``switchyard.worker.superseded`` (counter): answers discarded because the request was
  given to another worker or epoch meanwhile (this worker had been declared dead, or
  the request moved), and assignments dropped at intake for the same reason;
* ``switchyard.worker.model_swaps`` (observable counter): models loaded into memory
  (swap-ins of the model cache; always 0 on an emulated worker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import Observation
from switchyard import __version__
from switchyard.contracts.messages import CompletionStatus
from switchyard.telemetry import Telemetry
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import observe

SCOPE = "switchyard.worker"
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class WorkerMetrics:
    """The instruments of one worker.

    Args:
        telemetry: the process's providers.
        attributes: the worker's ``worker_id`` and ``emulated`` (called at each record:
            ``emulated`` is known once the backend is built).
        waiting, running, swaps: counts the observable instruments read.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        attributes: Callable[[], dict[str, str | bool]],
        *,
        waiting: Callable[[], int | None],
        running: Callable[[], int | None],
        swaps: Callable[[], int | None],
    ) -> None:
        self._attributes = attributes
        self._waiting = waiting
        self._running = running
        self._swaps = swaps
        meter = telemetry.meter_provider.get_meter(SCOPE, __version__)
        self._batch_size = meter.create_histogram(
            "switchyard.worker.batch.size",
            unit="{request}",
            description="Requests started together (a batch, or one prefill's admissions).",
            explicit_bucket_boundaries_advisory=_BATCH_SIZE_BUCKETS,
        )
        self._execution_s = meter.create_histogram(
            "switchyard.worker.execution.duration",
            unit="s",
            description="Seconds from a request's start to its finish on this worker.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self._completions = meter.create_counter(
            "switchyard.worker.completions",
            unit="{request}",
            description="Answers recorded, by status.",
        )
        self._superseded = meter.create_counter(
            "switchyard.worker.superseded",
            unit="{request}",
            description="Answers discarded and assignments dropped: the request had been "
            "given to another worker or epoch.",
        )
        self._handoffs = meter.create_counter(
            "switchyard.worker.handoffs",
            unit="{request}",
            description="Requests prefilled here and handed, with their KV cache, to their "
            "decode worker (prefill/decode disaggregation).",
        )
        provider = telemetry.meter_provider
        # Bound methods: held weakly, so a worker that is gone stops reporting.
        observe(
            provider,
            SCOPE,
            "switchyard.worker.queue_length",
            self._observe_waiting,
            unit="{request}",
            description="Requests waiting on the worker.",
        )
        observe(
            provider,
            SCOPE,
            "switchyard.worker.running",
            self._observe_running,
            unit="{request}",
            description="Requests running on the worker.",
        )
        observe(
            provider,
            SCOPE,
            "switchyard.worker.model_swaps",
            self._observe_swaps,
            kind="counter",
            unit="{model}",
            description="Models loaded into memory (swap-ins).",
        )

    def _observation(self, value: int | None) -> Iterable[Observation]:
        return [] if value is None else [Observation(value, self._attributes())]

    def _observe_waiting(self) -> Iterable[Observation]:
        return self._observation(self._waiting())

    def _observe_running(self) -> Iterable[Observation]:
        return self._observation(self._running())

    def _observe_swaps(self) -> Iterable[Observation]:
        return self._observation(self._swaps())

    def batch_started(self, size: int) -> None:
        self._batch_size.record(size, self._attributes())

    def executed(self, status: CompletionStatus, model: str, execution_s: float | None) -> None:
        """One answer recorded, and its execution time when it started here."""
        attributes = self._attributes()
        self._completions.add(1, {**attributes, "status": status.value})
        if execution_s is not None:
            self._execution_s.record(
                max(0.0, execution_s), {**attributes, "model": model, "status": status.value}
            )

    def handed_off(self) -> None:
        """One request handed to its decode worker after its prefill."""
        self._handoffs.add(1, self._attributes())

    def superseded(self, count: int = 1) -> None:
        self._superseded.add(count, self._attributes())
