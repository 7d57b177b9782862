"""The Prometheus text exposition of OpenTelemetry metrics, and where it is served:
``GET /metrics`` on the health server of every service."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator

import pytest
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from switchyard.config import Settings, load_settings
from switchyard.runtime import HealthServer, Service, ServiceContext, run_service
from switchyard.telemetry import configure_telemetry
from switchyard.telemetry.observables import observe
from switchyard.telemetry.prometheus import (
    CONTENT_TYPE,
    PrometheusMetricReader,
    metric_name,
    render_metrics,
)

from tests.support.http import raw_http

WAIT_S = 10.0


@pytest.fixture
def meter() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def _render(reader: InMemoryMetricReader) -> list[str]:
    return render_metrics(reader.get_metrics_data()).splitlines()


def test_a_counter_is_rendered_with_help_type_total_and_labels(
    meter: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = meter
    requests = provider.get_meter("t").create_counter(
        "switchyard.ingress.requests", unit="{request}", description="Inference calls answered."
    )
    requests.add(2, {"app": "llama-2-7b", "outcome": "ok"})
    requests.add(1, {"app": "llama-2-7b", "outcome": "timeout"})
    assert _render(reader) == [
        "# HELP switchyard_ingress_requests_total Inference calls answered.",
        "# TYPE switchyard_ingress_requests_total counter",
        'switchyard_ingress_requests_total{app="llama-2-7b",outcome="ok"} 2.0',
        'switchyard_ingress_requests_total{app="llama-2-7b",outcome="timeout"} 1.0',
    ]


def test_a_histogram_has_cumulative_buckets_sum_and_count_and_its_unit_in_the_name(
    meter: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = meter
    latency = provider.get_meter("t").create_histogram(
        "ingress.latency",
        unit="s",
        description="Seconds to answer.",
        explicit_bucket_boundaries_advisory=[0.1, 0.5],
    )
    for value in (0.05, 0.25, 0.25, 2.0):
        latency.record(value, {"app": "a"})
    assert _render(reader) == [
        "# HELP switchyard_ingress_latency_seconds Seconds to answer.",
        "# TYPE switchyard_ingress_latency_seconds histogram",
        'switchyard_ingress_latency_seconds_bucket{app="a",le="0.1"} 1.0',
        'switchyard_ingress_latency_seconds_bucket{app="a",le="0.5"} 3.0',
        'switchyard_ingress_latency_seconds_bucket{app="a",le="+Inf"} 4.0',
        'switchyard_ingress_latency_seconds_sum{app="a"} 2.55',
        'switchyard_ingress_latency_seconds_count{app="a"} 4.0',
    ]


def test_label_values_and_help_are_escaped_and_label_names_sanitised(
    meter: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = meter
    counter = provider.get_meter("t").create_counter("x.calls", description="a \\ b\nc")
    counter.add(1, {"http.route": 'say "hi"\\now\nplease', "ok": True, "n": 3})
    assert _render(reader) == [
        "# HELP switchyard_x_calls_total a \\\\ b\\nc",
        "# TYPE switchyard_x_calls_total counter",
        'switchyard_x_calls_total{http_route="say \\"hi\\"\\\\now\\nplease",n="3",ok="true"} 1.0',
    ]


def test_up_down_counters_and_observable_instruments_are_gauges_or_counters(
    meter: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = meter
    m = provider.get_meter("t")
    in_flight = m.create_up_down_counter("switchyard.ingress.in_flight", unit="{request}")
    in_flight.add(3)
    in_flight.add(-1)

    def mape(options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(0.125, {"worker_type": "a100-80gb/llama-2-7b"})

    def loaded(options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(7, {"worker_id": "torch-0"})

    m.create_observable_gauge("switchyard.predictor.mape", callbacks=[mape], unit="1")
    m.create_observable_counter("switchyard.worker.model_swaps", callbacks=[loaded])
    assert _render(reader) == [
        "# HELP switchyard_ingress_in_flight ",
        "# TYPE switchyard_ingress_in_flight gauge",
        "switchyard_ingress_in_flight 2.0",
        "# HELP switchyard_predictor_mape_ratio ",
        "# TYPE switchyard_predictor_mape_ratio gauge",
        'switchyard_predictor_mape_ratio{worker_type="a100-80gb/llama-2-7b"} 0.125',
        "# HELP switchyard_worker_model_swaps_total ",
        "# TYPE switchyard_worker_model_swaps_total counter",
        'switchyard_worker_model_swaps_total{worker_id="torch-0"} 7.0',
    ]


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        (
            "switchyard.bus.handler.duration",
            "s",
            "histogram",
            "switchyard_bus_handler_duration_seconds",
        ),
        ("bus.published", "{message}", "counter", "switchyard_bus_published"),
        ("a-b c", "By", "gauge", "switchyard_a_b_c_bytes"),
        ("x.rate", "By/s", "gauge", "switchyard_x_rate_bytes_per_second"),
        ("x.duration_seconds", "s", "histogram", "switchyard_x_duration_seconds"),
        ("x.done_total", "", "counter", "switchyard_x_done"),
        ("x.share", "1", "counter", "switchyard_x_share"),
        ("9lives", "", "gauge", "switchyard_9lives"),
    ],
)
def test_names_are_sanitised_prefixed_and_carry_their_unit(
    name: str, unit: str, kind: str, expected: str
) -> None:
    assert metric_name(name, unit, kind=kind) == expected


def test_nothing_measured_renders_nothing() -> None:
    assert render_metrics(None) == ""
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("t").create_counter("unused")
    assert reader.render() == ""
    provider.shutdown()


def test_callbacks_of_one_name_from_several_owners_all_report() -> None:
    """A meter provider keeps the first callback of an observable name only: the helper
    makes every worker of one process report, and forgets a discarded one."""
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    class Worker:
        def __init__(self, worker_id: str, waiting: int) -> None:
            self.worker_id, self.waiting = worker_id, waiting
            observe(provider, "t", "switchyard.worker.queue_length", self.queue, unit="{request}")

        def queue(self) -> Iterable[Observation]:
            return [Observation(self.waiting, {"worker_id": self.worker_id})]

    first, second = Worker("llm-0", 2), Worker("llm-1", 5)
    lines = reader.render().splitlines()
    assert 'switchyard_worker_queue_length{worker_id="llm-0"} 2.0' in lines
    assert 'switchyard_worker_queue_length{worker_id="llm-1"} 5.0' in lines
    del second
    assert 'switchyard_worker_queue_length{worker_id="llm-1"} 5.0' not in reader.render()
    assert first.waiting == 2
    provider.shutdown()


def test_configure_telemetry_always_attaches_a_prometheus_reader() -> None:
    made = configure_telemetry("t", load_settings({}), install_global=False)
    assert made.prometheus is not None
    made.meter_provider.get_meter("t").create_counter("switchyard.test.things").add(4)
    assert "switchyard_test_things_total 4.0" in made.prometheus.render().splitlines()
    made.shutdown()


# -- GET /metrics ----------------------------------------------------------------------------


async def test_the_health_server_serves_metrics_as_prometheus_text() -> None:
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("t").create_counter("switchyard.test.probes").add(1, {"path": "/x"})
    server = HealthServer("127.0.0.1", 0, metrics=reader.render)
    await server.start()
    try:
        server.mark_draining()  # a scrape is answered whatever the readiness
        head, body = await raw_http(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith("HTTP/1.1 200 ")
        assert f"Content-Type: {CONTENT_TYPE}" in head
        assert 'switchyard_test_probes_total{path="/x"} 1.0' in body.decode().splitlines()
        head, body = await raw_http(server.port, b"POST /metrics HTTP/1.1\r\n\r\n")
        assert head.startswith("HTTP/1.1 405 ")
        head, body = await raw_http(server.port, b"GET /nothing HTTP/1.1\r\n\r\n")
        assert head.startswith("HTTP/1.1 404 ")
        assert b"/metrics" in body
    finally:
        await server.stop()
        provider.shutdown()


class _Idle(Service):
    async def start(self) -> None:
        meter = self.ctx.telemetry.meter_provider.get_meter("t")
        meter.create_counter("switchyard.idle.starts").add(1)


class _Started(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.port: int | None = None
        self.arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "started":
            self.port = int(record.__dict__["health_port"])
            self.arrived.set()


async def test_every_service_serves_its_metrics_on_the_health_port() -> None:
    """run_service gives the health server the context's Prometheus reader."""
    from switchyard.bus import bus_from_settings
    from switchyard.state import state_from_settings

    started = _Started()
    logger = logging.getLogger("tests.prometheus.idle")
    logger.setLevel(logging.INFO)
    logger.addHandler(started)

    async def build(name: str, settings: Settings) -> ServiceContext:
        return ServiceContext(
            name=name,
            settings=settings,
            bus=bus_from_settings(settings),
            state=state_from_settings(settings),
            telemetry=configure_telemetry(name, settings, install_global=False),
            logger=logger,
            stopping=asyncio.Event(),
        )

    stop = asyncio.Event()
    settings = load_settings({}, health_port=0, drain_timeout_s=5.0)
    running = asyncio.create_task(
        run_service(_Idle, name="idle", settings=settings, build_context=build, stop=stop)
    )
    try:
        await asyncio.wait_for(started.arrived.wait(), WAIT_S)
        assert started.port is not None
        head, body = await raw_http(started.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert head.startswith("HTTP/1.1 200 ")
        assert "switchyard_idle_starts_total 1.0" in body.decode().splitlines()
    finally:
        stop.set()
        assert await asyncio.wait_for(running, WAIT_S) == 0
        logger.removeHandler(started)
