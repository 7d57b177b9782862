"""The replay engine and ``python -m loadgen replay`` against a fake ingress.

The fake implements the ingress's contract: OpenAI completions with a ``switchyard``
object, classification answers, pipeline results (the ``alibaba-lora`` catalogue's
pipelines), a 404 error body for an unknown model or
application, a 429 with Retry-After for chosen requests, and a slow model for the
timeout and open-loop cases. Engine tests talk to it in-process
(``httpx.ASGITransport``); the timeout, CLI and Ctrl-C tests serve it with uvicorn on a
free port.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from switchyard.serving.pipelines import pipeline_catalogue

from loadgen.__main__ import main
from loadgen.mixes import PIPELINE_PROMPT, PlannedRequest
from loadgen.replay import replay
from loadgen.replay_records import (
    CANCELLED,
    HTTP_ERROR,
    NOT_SENT,
    OK,
    REJECTED,
    TIMEOUT,
    TRANSPORT_ERROR,
    RequestRecord,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
KNOWN_MODELS = {"llama-2-7b", "llama-2-13b", "slow-model"}
KNOWN_APPS = {"digits", "fraud-like", "wine-dominant"}
KNOWN_PIPELINES = set(pipeline_catalogue("alibaba-lora")[1])


def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Any:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


class FakeIngress:
    """The ingress contract, with a fake timeline: scheduling 0.01 s, queueing 0.04 s,
    execution 1 ms per output token; the deadline is met below 100 output tokens."""

    def __init__(self, slow_s: float = 0.5, reject: frozenset[int] = frozenset()) -> None:
        self.slow_s = slow_s
        self.reject = reject
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/apps/{app}/infer", self.infer, methods=["POST"]),
            ]
        )

    def _rejected(self, request_id: str) -> bool:
        return int(request_id.rsplit("-", 1)[1]) in self.reject

    async def completions(self, request: Request) -> Any:
        body = await request.json()
        self.received.append(("/v1/completions", body))
        meta = body["switchyard"]
        if body["model"] not in KNOWN_MODELS:
            return error(404, f"unknown model {body['model']!r}", "not_found")
        if self._rejected(meta["request_id"]):
            return error(429, "queue full", "overloaded", {"Retry-After": "1"})
        if body["model"] == "slow-model":
            await asyncio.sleep(self.slow_s)
        finished_s = 100.05 + 0.001 * body["max_tokens"]
        return JSONResponse(
            {
                "id": "cmpl-" + meta["request_id"],
                "object": "text_completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": meta["prompt_tokens"],
                    "completion_tokens": body["max_tokens"],
                    "total_tokens": meta["prompt_tokens"] + body["max_tokens"],
                },
                "switchyard": {
                    "request_id": meta["request_id"],
                    "status": "completed",
                    "worker_id": "worker-0",
                    "worker_type": "emulated",
                    "variant": None,
                    "emulated": True,
                    "deadline_s": 130.0,
                    "deadline_met": body["max_tokens"] < 100,
                    "timeline": {
                        "arrival_s": 100.0,
                        "assigned_s": 100.01,
                        "started_s": 100.05,
                        "first_token_s": 100.06,
                        "finished_s": finished_s,
                    },
                },
            }
        )

    async def infer(self, request: Request) -> Any:
        body = await request.json()
        app = request.path_params["app"]
        self.received.append((f"/v1/apps/{app}/infer", body))
        if "exec_scale" in body:
            return self.pipeline(app, body)
        if app not in KNOWN_APPS:
            return error(404, f"unknown application {app!r}", "not_found")
        if self._rejected(body["request_id"]):
            return error(503, "no worker", "unavailable", {"Retry-After": "1"})
        return JSONResponse(
            {
                "request_id": body["request_id"],
                "app": app,
                "label": 1,
                "class_name": "one",
                "probabilities": [0.2, 0.8],
                "variant": "mlp-small",
                "worker_id": "worker-1",
                "emulated": False,
                "deadline_s": 1.0,
                "deadline_met": True,
                # no timeline: left out of the breakdown
            }
        )

    def pipeline(self, app: str, body: dict[str, Any]) -> Any:
        """A pipeline call: met its SLO when ``exec_scale`` is at most 1."""
        request_id = body["request_id"]
        if app not in KNOWN_PIPELINES:
            return error(404, f"unknown application {app!r}", "not_found")
        if self._rejected(request_id):
            return error(503, "no worker", "unavailable", {"Retry-After": "1"})
        stage = {"stage": "generate", "model": app.split("-")[0], "worker_id": "worker-2"}
        return JSONResponse(
            {
                "id": request_id,
                "object": "pipeline.result",
                "app": app,
                "output": {"generate": "image"},
                "stages": [stage],
                "latency_s": 1.0,
                "slo_s": 8.0,
                "met_slo": body["exec_scale"] <= 1.0,
                "emulated": True,
            }
        )


def llm(
    index: int, arrival_s: float, app: str = "llama-2-7b", max_tokens: int = 20
) -> PlannedRequest:
    return PlannedRequest(
        index=index,
        arrival_s=arrival_s,
        kind="llm",
        app=app,
        workload="conversation",
        prompt_tokens=10 + index,
        max_tokens=max_tokens,
    )


def classify(index: int, arrival_s: float, app: str = "digits") -> PlannedRequest:
    return PlannedRequest(
        index=index,
        arrival_s=arrival_s,
        kind="classification",
        app=app,
        workload="classification",
        features=(0.5, -1.0),
        true_label=1,
    )


async def run_in_process(
    fake: FakeIngress, plan: list[PlannedRequest], **kwargs: Any
) -> list[RequestRecord]:
    settings: dict[str, Any] = {"speedup": 1.0, "timeout_s": 10.0, "progress": False}
    settings.update(kwargs)
    result = await replay(
        plan,
        "http://fake",
        run_id="run",
        transport=httpx.ASGITransport(app=fake.app),
        **settings,
    )
    return result.records


# --------------------------------------------------------------------------- engine


async def test_sends_follow_the_trace_gaps_divided_by_the_speedup() -> None:
    fake = FakeIngress()
    arrivals = [0.0, 0.2, 0.5, 0.5, 0.9, 1.3]
    plan = [llm(i, a) for i, a in enumerate(arrivals)]

    records = await run_in_process(fake, plan, speedup=10.0)

    assert [r.scheduled_s for r in records] == pytest.approx([a / 10 for a in arrivals])
    sent = [r.sent_s for r in records]
    assert all(s is not None for s in sent)
    assert sent == sorted(sent)  # type: ignore[type-var]
    for r in records:
        assert r.send_lag_s == pytest.approx((r.sent_s or 0.0) - r.scheduled_s)
        assert r.send_lag_s is not None
        assert r.send_lag_s > -0.005  # never meaningfully early
    assert [body["switchyard"]["request_id"] for _, body in fake.received] == [
        f"run-{i}" for i in range(len(arrivals))
    ]


async def test_the_schedule_is_relative_to_the_first_arrival() -> None:
    plan = [llm(0, 5.0), llm(1, 5.5), llm(2, 7.0)]

    records = await run_in_process(FakeIngress(), plan, speedup=20.0)

    assert [r.scheduled_s for r in records] == pytest.approx([0.0, 0.025, 0.1])
    assert [r.arrival_s for r in records] == [5.0, 5.5, 7.0]


async def test_a_slow_answer_does_not_hold_back_the_next_send() -> None:
    fake = FakeIngress(slow_s=0.5)
    plan = [llm(0, 0.0, app="slow-model"), llm(1, 0.05)]

    slow, fast = await run_in_process(fake, plan)

    assert slow.outcome == OK
    assert slow.sent_s is not None
    assert slow.latency_s is not None
    assert fast.sent_s is not None
    # Open loop: request 1 went out while request 0 was still waiting for its answer.
    assert fast.sent_s < slow.sent_s + slow.latency_s
    assert fast.latency_s is not None
    assert fast.sent_s + fast.latency_s < slow.sent_s + slow.latency_s


async def test_outcomes_and_answer_fields_are_recorded() -> None:
    fake = FakeIngress(reject=frozenset({3}))
    plan = [
        llm(0, 0.0),
        llm(1, 0.0, app="llama-2-13b", max_tokens=500),
        llm(2, 0.0, app="gpt-9"),
        llm(3, 0.0),
        classify(4, 0.0),
        classify(5, 0.0, app="nope"),
    ]

    records = await run_in_process(fake, plan)

    assert [r.outcome for r in records] == [OK, OK, HTTP_ERROR, REJECTED, OK, HTTP_ERROR]
    assert [r.status_code for r in records] == [200, 200, 404, 429, 200, 404]
    first = records[0]
    assert first.emulated is True
    assert first.deadline_met is True
    assert first.worker_id == "worker-0"
    assert first.completion_tokens == 20
    assert first.timeline is not None
    assert first.timeline["finished_s"] == pytest.approx(100.07)
    assert records[1].deadline_met is False
    assert records[2].error_message == "unknown model 'gpt-9'"
    assert records[3].retry_after_s == 1.0
    assert records[4].label == 1
    assert records[4].emulated is False
    assert records[4].timeline is None
    assert fake.received[4] == (
        "/v1/apps/digits/infer",
        {"features": [0.5, -1.0], "request_id": "run-4"},
    )
    # Each request is sent once: a rejection is not retried.
    assert len(fake.received) == len(plan)


async def test_a_stop_sends_nothing_more_and_cancels_what_does_not_answer_in_time() -> None:
    fake = FakeIngress(slow_s=30.0)
    plan = [llm(0, 0.0), llm(1, 0.0, app="slow-model"), llm(2, 60.0), llm(3, 70.0)]
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)

    result = await replay(
        plan,
        "http://fake",
        speedup=1.0,
        timeout_s=60.0,
        progress=False,
        stop=stop,
        grace_s=0.1,
        transport=httpx.ASGITransport(app=fake.app),
    )

    assert result.stopped
    assert [r.outcome for r in result.records] == [OK, CANCELLED, NOT_SENT, NOT_SENT]
    assert result.records[1].sent_s is not None
    assert result.records[2].sent_s is None
    assert len(fake.received) == 2
    assert result.duration_s < 30.0


async def test_bad_engine_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="--speedup"):
        await replay([llm(0, 0.0)], "http://x", speedup=0.0, timeout_s=1.0, progress=False)
    with pytest.raises(ValueError, match="--timeout-s"):
        await replay([llm(0, 0.0)], "http://x", speedup=1.0, timeout_s=-1.0, progress=False)
    with pytest.raises(ValueError, match="http:// or https://"):
        await replay([llm(0, 0.0)], "ftp://x", speedup=1.0, timeout_s=1.0, progress=False)


# --------------------------------------------------------------------------- real server


class Served:
    """A FakeIngress served by uvicorn on a free port, in a background thread."""

    def __init__(self, fake: FakeIngress) -> None:
        self.fake = fake
        config = uvicorn.Config(
            fake.app,
            host="127.0.0.1",
            port=0,
            log_level="critical",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake ingress did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served() -> Iterator[tuple[FakeIngress, str]]:
    fake = FakeIngress(slow_s=2.0, reject=frozenset({1}))
    with Served(fake) as url:
        yield fake, url


async def test_a_slow_answer_past_the_timeout_is_a_timeout(served: tuple[FakeIngress, str]) -> None:
    _, url = served

    result = await replay(
        [llm(0, 0.0, app="slow-model"), llm(1, 0.0), llm(2, 0.0)],
        url,
        speedup=1.0,
        timeout_s=0.3,
        progress=False,
    )

    assert [r.outcome for r in result.records] == [TIMEOUT, REJECTED, OK]
    assert result.records[0].latency_s is None
    assert result.records[0].error_type == "RequestTimeoutError"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_a_target_that_goes_away_gives_transport_errors() -> None:
    result = await replay(
        [llm(0, 0.0)], closed_port_url(), speedup=1.0, timeout_s=2.0, progress=False
    )

    assert result.records[0].outcome == TRANSPORT_ERROR
    assert result.records[0].error_type == "ConnectError"


# --------------------------------------------------------------------------- CLI


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["replay", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--trace", "/no/such/trace_conv.csv"], ["trace_conv.csv", "no such file"]),
        (
            ["--trace", "azure-sample-conv"],
            ["unknown trace 'azure-sample-conv'", "azure-conv-sample"],
        ),
        (["--app-map", "conversation"], ["--app-map", "WORKLOAD=APP"]),
        (["--app-map", "chat=llama-2-7b"], ["--app-map", "'chat'"]),
        (["--speedup", "0"], ["--speedup", "> 0"]),
        (["--speedup", "-2"], ["--speedup"]),
        (["--speedup", "fast"], ["--speedup", "'fast'"]),
        (["--limit", "0"], ["--limit", "at least 1"]),
        (["--timeout-s", "0"], ["--timeout-s"]),
        (["--mix", "multimodel"], ["--trace", "multimodel", "takes no trace"]),
        (["--mix", "everything"], ["unknown mix"]),
        (["--classification-share", "0.2"], ["--classification-share", "--mix mixed"]),
        (["--mix", "mixed", "--classification-share", "2"], ["within [0, 1]"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], fragments: list[str]
) -> None:
    defaults = {"--trace": "azure-conv-sample", "--target": "http://127.0.0.1:9"}
    for flag, value in defaults.items():
        if flag not in args:
            args = [flag, value, *args]

    code, out, err = run_cli(capsys, *args)

    assert_one_line_error(code, err, *fragments)
    assert out == ""


def test_an_unreachable_target_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = closed_port_url()

    code, out, err = run_cli(capsys, "--trace", "azure-conv-sample", "--target", url)

    assert_one_line_error(code, err, "cannot reach the target", url)
    assert out == ""


def test_a_malformed_target_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--trace", "azure-conv-sample", "--target", "localhost:8000")

    assert_one_line_error(code, err, "--target", "localhost:8000")


def test_help_says_how_to_replay_multimodel(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--help"]) == 0
    out, _ = capsys.readouterr()
    assert "SWITCHYARD_PIPELINE_CATALOGUE=alibaba-lora" in out
    assert "--speedup T" in out
    assert "--classification-share" in out


def test_the_command_replays_and_writes_json_and_a_report(
    served: tuple[FakeIngress, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake, url = served
    out_json = tmp_path / "out" / "replay.json"

    code, out, err = run_cli(
        capsys,
        "--trace", "azure-mix-sample", "--target", url, "--speedup", "1000", "--limit", "40",
        "--mix", "mixed", "--seed", "3", "--app-map", "code=llama-2-7b",
        "--json", str(out_json), "--report", str(tmp_path / "report"),
    )  # fmt: skip

    assert code == 0, err
    assert "Traceback" not in err
    assert len(fake.received) == 40
    document = json.loads(out_json.read_text())
    assert set(document) == {"config", "summary", "per_app", "requests"}
    assert document["config"]["mix"] == "mixed"
    assert document["config"]["classification_share"] == 0.5
    assert document["config"]["trace"] == "azure-mix-sample"
    summary = document["summary"]
    assert summary["sent"] == 40
    assert summary["rejected"] == 1  # request 1
    first = document["requests"][1]
    assert summary["errors_by_status"] == {"429" if first["kind"] == "llm" else "503": 1}
    kinds = [r["kind"] for r in document["requests"]]
    assert kinds.count("classification") == 20
    llm_apps = {r["app"] for r in document["requests"] if r["kind"] == "llm"}
    assert llm_apps == {"llama-2-7b"}
    assert set(document["per_app"]) <= {"llama-2-7b", "digits", "fraud-like", "wine-dominant"}
    assert summary["breakdown"]["execution"]["count"] == summary["answered_ok"] - sum(
        1 for r in document["requests"] if r["kind"] == "classification" and r["outcome"] == "ok"
    )
    assert "llama-2-7b" in out
    assert "performance model" in out
    report = tmp_path / "report"
    assert (report / "index.html").exists()
    assert (report / "latency_cdf.png").exists()
    assert json.loads((report / "replay.json").read_text())["summary"]["sent"] == 40


def test_the_command_replays_the_multimodel_mix_as_pipeline_calls(
    served: tuple[FakeIngress, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake, url = served
    out_json = tmp_path / "replay.json"

    code, out, err = run_cli(
        capsys,
        "--mix", "multimodel", "--target", url, "--speedup", "1000", "--limit", "30",
        "--json", str(out_json),
    )  # fmt: skip

    assert code == 0, err
    assert len(fake.received) == 30
    assert {path.split("/")[3] for path, _ in fake.received} <= KNOWN_PIPELINES
    for _, body in fake.received:
        assert set(body) == {"request_id", "exec_scale", "input"}
        assert body["input"] == PIPELINE_PROMPT
    document = json.loads(out_json.read_text())
    assert document["config"]["mix"] == "multimodel"
    assert document["config"]["pipeline_catalogue"] == "alibaba-lora"
    summary = document["summary"]
    assert summary["sent"] == 30
    assert summary["rejected"] == 1  # request 1
    assert summary["answered_ok"] == 29
    # Every call is judged: 29 by their met_slo, the rejection as a miss.
    assert summary["slo_judged"] == 30
    requests = document["requests"]
    missed = [r for r in requests if r["outcome"] != "ok" or r["exec_scale"] > 1.0]
    assert summary["slo_violations"] == len(missed)
    assert set(document["per_app"]) <= KNOWN_PIPELINES
    assert {r["kind"] for r in document["requests"]} == {"pipeline"}
    assert "pipeline calls of the alibaba-lora catalogue" in out


def test_ctrl_c_stops_sending_and_still_prints_the_report() -> None:
    fake = FakeIngress(slow_s=0.0)
    with Served(fake) as url:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "loadgen", "replay", "--trace", "azure-conv-sample",
                "--target", url, "--speedup", "2", "--no-progress",
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while len(fake.received) < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(fake.received) >= 5
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert "stopping" in err
    assert "llama-2-7b" in out
    assert "never sent" in out
    assert len(fake.received) < 1000
