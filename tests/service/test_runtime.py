"""The service runtime, in process, with a fake bus, state store and telemetry injected
through ``build_context``: the health endpoint over real loopback HTTP, supervised
routines, the drain, start-up failures, exit codes, and bad configuration."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import pytest
from switchyard.bus import bus_from_settings
from switchyard.config import Settings
from switchyard.errors import StateError, SwitchyardError, TransportError
from switchyard.runtime import (
    ContextBuilder,
    HealthServer,
    Service,
    ServiceContext,
    backoff_s,
    main_for,
    run_service,
)

from tests.service.runtime_support import (
    WAIT_S,
    FakeState,
    Harness,
    harness_fixture,  # noqa: F401 (the ``harness`` fixture)
    log_field,
    settings_for,
)
from tests.support.http import raw_http

if TYPE_CHECKING:
    pass


# -- HTTP over loopback ---------------------------------------------------------------


async def _http(port: int, raw: bytes) -> tuple[int, bytes]:
    head, body = await raw_http(port, raw)
    assert "Connection: close" in head
    return int(head.split()[1]), body


async def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = await _http(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return status, json.loads(body)


# -- the health server alone ----------------------------------------------------------


@pytest.fixture
async def health() -> AsyncIterator[tuple[HealthServer, dict[str, bool]]]:
    state = {"alive": True, "bus": True}

    async def bus_check() -> bool:
        if not state["bus"]:
            raise ConnectionError("broker down")
        return True

    server = HealthServer("127.0.0.1", 0, alive=lambda: state["alive"], checks={"bus": bus_check})
    await server.start()
    yield server, state
    await server.stop()


async def test_liveness_and_readiness_follow_the_service(
    health: tuple[HealthServer, dict[str, bool]],
) -> None:
    server, state = health
    assert server.port > 0
    assert await _get(server.port, "/healthz") == (200, {"status": "ok"})
    assert await _get(server.port, "/readyz") == (503, {"status": "starting"})
    server.mark_started()
    assert await _get(server.port, "/readyz?verbose=1") == (
        200,
        {"status": "ready", "checks": {"bus": "ok"}},
    )
    state["bus"] = False
    status, body = await _get(server.port, "/readyz")
    assert (status, body["failing"]) == (503, ["bus"])
    assert body["checks"] == {"bus": "error: ConnectionError: broker down"}
    server.mark_draining()
    assert await _get(server.port, "/readyz") == (503, {"status": "draining"})
    state["alive"] = False
    assert await _get(server.port, "/healthz") == (503, {"status": "failed"})


async def test_each_check_is_named_and_bounded_by_its_timeout(
    health: tuple[HealthServer, dict[str, bool]],
) -> None:
    server, _ = health
    hang = asyncio.Event()

    async def slow() -> bool:
        await hang.wait()
        return True

    async def says_no() -> bool:
        return False

    server.add_check("slow", slow, timeout_s=0.05)
    server.add_check("says_no", says_no)
    server.mark_started()
    status, body = await _get(server.port, "/readyz")
    assert status == 503
    assert body["failing"] == ["slow", "says_no"]
    assert body["checks"] == {"bus": "ok", "slow": "timed out after 0.05 s", "says_no": "not ready"}


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\n\r\n", 404),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405),
        (b"DELETE /readyz HTTP/1.1\r\n\r\n", 405),
        (b"garbage\r\n\r\n", 400),
        (b"GET /healthz SPDY/3\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"x" * 10_000 + b"\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n", 400),  # the client gives up half-way
    ],
)
async def test_other_requests_get_clear_errors(
    health: tuple[HealthServer, dict[str, bool]], raw: bytes, status: int
) -> None:
    server, _ = health
    complete = raw.endswith((b"\r\n\r\n", b"}"))
    head, body = await raw_http(server.port, raw, eof=not complete)
    assert int(head.split()[1]) == status
    assert "error" in json.loads(body)


async def test_head_answers_without_a_body(health: tuple[HealthServer, dict[str, bool]]) -> None:
    server, _ = health
    status, body = await _http(server.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert (status, body) == (200, b"")


async def test_a_stopped_server_refuses_connections() -> None:
    server = HealthServer("127.0.0.1", 0)
    await server.start()
    port = server.port
    await server.stop()
    with pytest.raises(ConnectionRefusedError):
        await _get(port, "/healthz")
    with pytest.raises(RuntimeError):
        _ = server.port


def test_backoff_doubles_from_100_ms_up_to_5_s() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.8]
    assert backoff_s(7) == 5.0
    assert backoff_s(1000) == 5.0


# -- fakes and a scripted service -----------------------------------------------------


Routine = Callable[["Scripted"], Awaitable[None]]


class Scripted(Service):
    """A service whose routines the test writes."""

    def __init__(self, ctx: ServiceContext, routines: dict[str, Routine]) -> None:
        super().__init__(ctx)
        self.script = routines

    async def start(self) -> None:
        for name, body in self.script.items():
            self.spawn_routine(name, functools.partial(body, self))


class Run:
    """``run_service`` of a :class:`Scripted` service, running in a task."""

    def __init__(self, harness: Harness, routines: dict[str, Routine], **settings: object) -> None:
        self.harness = harness
        self.stop = asyncio.Event()
        self.services: list[Scripted] = []
        connect_timeout_s = float(cast("float", settings.pop("connect_timeout_s", 5.0)))

        def factory(ctx: ServiceContext) -> Service:
            self.services.append(Scripted(ctx, routines))
            return self.services[-1]

        builder: ContextBuilder = harness.build_context
        self.task = asyncio.create_task(
            run_service(
                factory,
                name="scripted",
                settings=settings_for(**settings),
                build_context=builder,
                stop=self.stop,
                connect_timeout_s=connect_timeout_s,
            )
        )

    @property
    def service(self) -> Scripted:
        return self.services[0]

    async def port(self) -> int:
        return int(log_field(await self.harness.log.wait_for("started"), "health_port"))

    async def exit_code(self) -> int:
        return await asyncio.wait_for(self.task, WAIT_S)


async def _until_stopping(service: Scripted) -> None:
    await service.ctx.stopping.wait()


# -- run_service ----------------------------------------------------------------------


async def test_a_service_starts_serves_drains_and_closes_everything(harness: Harness) -> None:
    release = asyncio.Event()

    async def finishes_in_hand_work(service: Scripted) -> None:
        await service.ctx.stopping.wait()
        await release.wait()  # in-flight work the drain waits for

    run = Run(harness, {"work_routine": finishes_in_hand_work})
    port = await run.port()
    started = harness.log.with_event("started")[0]
    assert log_field(started, "health_url") == f"http://127.0.0.1:{port}"
    assert harness.bus.started
    assert await _get(port, "/healthz") == (200, {"status": "ok"})
    assert await _get(port, "/readyz") == (
        200,
        {"status": "ready", "checks": {"bus": "ok", "state": "ok"}},
    )
    harness.bus.reachable = False
    status, body = await _get(port, "/readyz")
    assert (status, body["failing"]) == (503, ["bus"])

    run.stop.set()
    await harness.log.wait_for("draining")
    assert await _get(port, "/readyz") == (503, {"status": "draining"})
    assert await _get(port, "/healthz") == (200, {"status": "ok"})
    release.set()
    assert await run.exit_code() == 0
    assert (harness.bus.stopped, harness.state.closed) == (True, True)
    assert harness.telemetry.shutdowns == 1
    with pytest.raises(ConnectionRefusedError):
        await _get(port, "/healthz")


async def test_a_retriable_error_restarts_the_routine_until_it_recovers(
    harness: Harness,
) -> None:
    attempts: list[int] = []
    recovered = asyncio.Event()

    async def flaky(service: Scripted) -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("redis restarting")
        recovered.set()
        await service.ctx.stopping.wait()

    run = Run(harness, {"flaky_routine": flaky})
    await asyncio.wait_for(recovered.wait(), WAIT_S)
    port = await run.port()
    assert await _get(port, "/healthz") == (200, {"status": "ok"})
    run.stop.set()
    assert await run.exit_code() == 0
    assert len(attempts) == 3
    assert run.service.failure is None
    warnings = [r for r in harness.log.records if getattr(r, "routine", None) == "flaky_routine"]
    assert len(warnings) == 2
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in warnings)
    assert "redis restarting" in warnings[0].getMessage()


async def test_a_routine_leaves_quietly_on_a_retriable_error_while_stopping(
    harness: Harness,
) -> None:
    async def drops_on_stop(service: Scripted) -> None:
        await service.ctx.stopping.wait()
        raise ConnectionError("subscription closed under us")

    run = Run(harness, {"drops_routine": drops_on_stop})
    await run.port()
    run.stop.set()
    assert await run.exit_code() == 0
    assert not [r for r in harness.log.records if r.levelno >= logging.WARNING]


async def test_a_non_retriable_error_fails_liveness_and_exits_1(harness: Harness) -> None:
    go = asyncio.Event()
    checked = asyncio.Event()

    async def breaks(service: Scripted) -> None:
        await go.wait()
        raise ValueError("the registry file is corrupt")

    async def holds_the_drain(service: Scripted) -> None:
        await service.ctx.stopping.wait()
        await checked.wait()

    run = Run(harness, {"breaks_routine": breaks, "holder_routine": holds_the_drain})
    port = await run.port()
    go.set()
    await harness.log.wait_for("draining")
    assert await _get(port, "/healthz") == (503, {"status": "failed"})
    assert (await _get(port, "/readyz"))[0] == 503
    checked.set()
    assert await run.exit_code() == 1
    assert isinstance(run.service.failure, ValueError)
    with_traceback = [r for r in harness.log.records if r.exc_info]
    assert len(with_traceback) == 1
    assert "breaks_routine" in with_traceback[0].getMessage()


async def test_a_drain_that_overruns_its_timeout_exits_1_naming_the_routine(
    harness: Harness,
) -> None:
    async def stubborn(service: Scripted) -> None:
        await service.ctx.stopping.wait()
        await asyncio.sleep(60)

    run = Run(harness, {"stubborn_routine": stubborn}, drain_timeout_s=0.2)
    await run.port()
    run.stop.set()
    assert await run.exit_code() == 1
    timed_out = await harness.log.wait_for("drain-timeout")
    assert log_field(timed_out, "routines") == ["stubborn_routine"]
    assert "stubborn_routine" in timed_out.getMessage()
    assert harness.bus.stopped


async def test_the_bus_is_retried_at_start(harness: Harness) -> None:
    harness.bus.start_failures = 2
    run = Run(harness, {"idle_routine": _until_stopping})
    await run.port()
    assert harness.bus.start_calls == 3
    assert len(harness.log.with_event("connect-retry")) == 2
    run.stop.set()
    assert await run.exit_code() == 0


async def test_an_unreachable_broker_exits_1_with_one_line_naming_it(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.bus.start_failures = -1  # never succeeds
    run = Run(
        harness,
        {"idle_routine": _until_stopping},
        bus="kafka",
        kafka_bootstrap="127.0.0.1:1",
        connect_timeout_s=0.3,
    )
    assert await run.exit_code() == 1
    err = capsys.readouterr().err
    assert err.startswith("switchyard scripted: could not connect to Kafka at 127.0.0.1:1 within")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert not harness.log.with_event("started")
    assert harness.telemetry.shutdowns == 1


async def test_an_unreachable_redis_is_named_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    harness = Harness(state=FakeState(error=StateError("Redis is unreachable")))
    try:
        run = Run(
            harness,
            {"idle_routine": _until_stopping},
            state="redis",
            redis_url="redis://:hunter2@127.0.0.1:1/0",
            connect_timeout_s=0.3,
        )
        assert await run.exit_code() == 1
    finally:
        harness.close()
    err = capsys.readouterr().err
    assert "Redis at redis://:***@127.0.0.1:1/0" in err
    assert "hunter2" not in err


async def test_the_real_kafka_bus_unreachable_exits_1_without_a_traceback(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_for(bus="kafka", kafka_bootstrap="127.0.0.1:1")

    async def real_bus(name: str, settings: Settings) -> ServiceContext:
        ctx = await harness.build_context(name, settings)
        return ServiceContext(
            name=ctx.name,
            settings=ctx.settings,
            bus=bus_from_settings(settings),
            state=ctx.state,
            telemetry=ctx.telemetry,
            logger=ctx.logger,
            stopping=ctx.stopping,
        )

    code = await run_service(
        lambda ctx: Scripted(ctx, {}),
        name="scripted",
        settings=settings,
        build_context=real_bus,
        connect_timeout_s=0.5,
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "Kafka at 127.0.0.1:1" in err
    assert "Traceback" not in err


async def test_a_non_retriable_start_error_exits_1_at_once(harness: Harness) -> None:
    harness.bus.start_failures = -1
    harness.bus.error = TransportError("topic creation refused", retriable=False)
    run = Run(harness, {}, connect_timeout_s=60)
    assert await run.exit_code() == 1
    assert harness.bus.start_calls == 1


async def test_a_failing_service_start_exits_1(harness: Harness) -> None:
    class Broken(Service):
        async def start(self) -> None:
            raise SwitchyardError("no such model registry")

    code = await run_service(
        Broken, name="broken", settings=settings_for(), build_context=harness.build_context
    )
    assert code == 1
    failed = harness.log.with_event("start-failed")
    assert "no such model registry" in failed[0].getMessage()
    assert harness.bus.stopped


async def test_a_stop_while_connecting_exits_0_at_once(harness: Harness) -> None:
    harness.bus.start_failures = -1
    run = Run(harness, {}, connect_timeout_s=60)
    await harness.log.wait_for("connect-retry")
    run.stop.set()
    assert await run.exit_code() == 0
    assert harness.log.with_event("start-aborted")


# -- main_for -------------------------------------------------------------------------


def test_bad_configuration_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWITCHYARD_HEALTH_PORT", "http")
    monkeypatch.setenv("SWITCHYARD_DRAIN_TIMEOUT_S", "-1")
    with pytest.raises(SystemExit) as exited:
        main_for(lambda ctx: Scripted(ctx, {}), name="demo")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("switchyard demo: invalid configuration")
    assert "SWITCHYARD_HEALTH_PORT='http'" in err
    assert "SWITCHYARD_DRAIN_TIMEOUT_S='-1'" in err
    assert "Traceback" not in err
