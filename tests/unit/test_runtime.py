"""The service runtime, in process: health endpoint, supervision, drain, exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import switchyard.runtime.service as runtime_service
from switchyard.config import Settings, load_settings
from switchyard.errors import SwitchyardError
from switchyard.runtime import HealthServer, Service, ServiceContext, run_service

pytestmark = pytest.mark.unit


async def _http(port: int, raw: bytes) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    return await _http(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


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
    assert await _get(server.port, "/healthz") == (200, {"status": "ok"})
    assert await _get(server.port, "/readyz") == (200, {"status": "ready", "checks": {"bus": True}})
    state["bus"] = False
    status, body = await _get(server.port, "/readyz")
    assert (status, body["failing"]) == (503, ["bus"])
    server.draining = True
    assert await _get(server.port, "/readyz") == (503, {"status": "draining"})
    state["alive"] = False
    assert await _get(server.port, "/healthz") == (503, {"status": "failed"})


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\n\r\n", 404),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"garbage\r\n\r\n", 400),
    ],
)
async def test_other_requests_get_clear_errors(
    health: tuple[HealthServer, dict[str, bool]], raw: bytes, status: int
) -> None:
    server, _ = health
    got, body = await _http(server.port, raw)
    assert got == status
    assert "error" in body


def _settings(**overrides: object) -> Settings:
    values: dict[str, object] = {"health_port": 0, "drain_timeout_s": 5.0}
    values.update(overrides)
    return load_settings({}, **values)


RoutineBody = Callable[["_Scripted"], Awaitable[None]]


class _Scripted(Service):
    """A service whose one routine is written by the test; ``stop`` ends the run."""

    def __init__(self, ctx: ServiceContext, body: RoutineBody, stop: asyncio.Event) -> None:
        super().__init__(ctx)
        self._body = body
        self.stop = stop

    async def start(self) -> None:
        self.spawn_routine("scripted_routine", lambda: self._body(self))


async def _run(body: RoutineBody, **settings: object) -> tuple[int, _Scripted]:
    made: list[_Scripted] = []
    stop = asyncio.Event()

    def factory(ctx: ServiceContext) -> Service:
        made.append(_Scripted(ctx, body, stop))
        return made[0]

    code = await run_service(factory, name="scripted", settings=_settings(**settings), stop=stop)
    return code, made[0]


async def test_a_retriable_error_restarts_the_routine() -> None:
    attempts: list[int] = []

    async def flaky(service: _Scripted) -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("redis restarting")
        service.stop.set()
        await service.ctx.stopping.wait()

    code, service = await _run(flaky)
    assert code == 0
    assert len(attempts) == 3
    assert service.failure is None


async def test_a_non_retriable_error_fails_the_service_with_exit_code_1() -> None:
    async def broken(service: _Scripted) -> None:
        raise SwitchyardError("the registry file is corrupt")

    code, service = await _run(broken)
    assert code == 1
    assert isinstance(service.failure, SwitchyardError)


async def test_a_drain_that_overruns_its_timeout_exits_1() -> None:
    async def stubborn(service: _Scripted) -> None:
        service.stop.set()
        await asyncio.sleep(60)

    code, _ = await _run(stubborn, drain_timeout_s=0.3)
    assert code == 1


async def test_an_unreachable_broker_exits_1_with_a_message_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_service, "_CONNECT_TIMEOUT_S", 0.5)

    async def idle(service: _Scripted) -> None:
        return None

    code = await run_service(
        lambda ctx: _Scripted(ctx, idle, asyncio.Event()),
        name="scripted",
        settings=_settings(bus="kafka", kafka_bootstrap="127.0.0.1:1"),
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "127.0.0.1:1" in err
    assert "Traceback" not in err
