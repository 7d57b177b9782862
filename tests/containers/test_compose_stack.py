"""docker-compose.yml in real containers, end to end, in order:

1. the project's images built from deploy/docker/Dockerfile, and ``docker compose up
   --wait`` of the whole file (every health check green, the registry job done);
2. every health endpoint: each Switchyard service's /healthz and /readyz (probed inside
   its container: they listen on loopback), the ingress, Kafka, Redis, the collector and
   Jaeger through their published ports;
3. through the published API port (HAProxy over the ingress replicas): completions on
   the emulated workers and on the torch worker's tiny-lm, classification calls, a
   streamed chat;
4. ``worker-llm`` scaled to three replicas while calls keep coming (each answered; the
   new one takes work) and back to two (the
   removed one drains: what ran on it finishes there, it exits 0, it is recorded drained);
   ``ingress`` scaled to two behind the one port (both take calls) and back to one while
   calls keep coming (none refused);
5. a worker container SIGKILLed (``docker kill``) mid-replay: every request answered
   once, none run twice, the dead worker's requests re-assigned;
6. the compose file's ``loadgen`` profile; traces of the calls found in Jaeger;
7. ``docker compose down -v``: no container, network or volume of the project left.

The steps share one stack (a module fixture) and run in file order.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from switchyard.contracts.messages import Assignment, Completion, CompletionStatus
from switchyard.contracts.topics import ANSWERS, WORKER_EVENTS, WORKER_INBOX
from switchyard.traces import resolve_trace

from loadgen.harness.process_stack import read_topic
from loadgen.harness.recovery import third_of_the_way_s
from loadgen.mixes import build_plan
from loadgen.replay import replay
from services.scheduler.windows import SHORT_CIRCUIT_WORKER
from tests.containers.stack import (
    AUTH,
    COLLECTOR,
    COMPOSE_DEMO_API_KEY,
    IMAGES,
    INGRESS,
    JAEGER,
    KAFKA,
    PROMETHEUS,
    Workers,
    build_image,
    compose,
    hostname_of,
    ingress_calls,
    leftovers,
    probe,
    project_containers,
    record_timing,
    scale,
    service_of,
    torch_index,
)
from tests.support.dashboard import alert_names, panel_queries

# Builds (several minutes cold), start-up and the scenario share the first test's limit.
pytestmark = pytest.mark.timeout(3600)

SWITCHYARD_SERVICES = {
    "ingress",
    "monitor",
    "predictor",
    "estimator",
    "scheduler",
    "rebalancer",
    "worker-llm",
    "worker-llm-13b",
    "worker-torch",
}
T = TypeVar("T")
LONG_DEADLINE = {"deadline_ms": 120_000}
"""Calls the tests need answered: a deadline admission control can always meet."""


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    try:
        engine = docker.from_env(timeout=600)
        engine.ping()
    except docker.errors.DockerException as error:
        pytest.fail(
            f"no Docker engine answers ({error}): run deploy/local/docker.sh", pytrace=False
        )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def stack(client: docker.DockerClient) -> Iterator[docker.DockerClient]:
    """The project's images built, then the whole file up and healthy; down at the end."""
    index = torch_index()
    print(f"\ntorch from {index}")
    for target in IMAGES:
        buildargs = {"TORCH_INDEX_URL": index} if target == "ml" else {}
        seconds = build_image(client, target, buildargs)
        print(f"image {IMAGES[target]}: {seconds:.0f} s")
    compose("--profile", "loadgen", "down", "--volumes", "--remove-orphans", "--timeout", "5")
    start = time.monotonic()
    try:
        compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", "600", timeout_s=900)
    except AssertionError as error:
        logs = compose("logs", "--no-color", "--tail", "40", check=False).stdout
        compose("--profile", "loadgen", "down", "--volumes", "--remove-orphans", check=False)
        raise AssertionError(f"{error}\n{logs[-12000:]}") from None
    record_timing("compose up --wait", time.monotonic() - start)
    print(f"compose up --wait: {time.monotonic() - start:.0f} s")
    yield client
    compose(
        "--profile",
        "loadgen",
        "down",
        "--volumes",
        "--remove-orphans",
        "--timeout",
        "20",
        check=False,
    )


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    records = Workers()
    yield records
    records.close()


def why() -> str:
    """The last lines of every service's log, for a failure message."""
    return compose("logs", "--no-color", "--tail", "25", check=False).stdout[-15000:]


def complete(model: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": "Say hello to the containers",
        "max_tokens": max_tokens,
        "switchyard": LONG_DEADLINE,
        **extra,
    }
    answer = httpx.post(f"{INGRESS}/v1/completions", json=body, headers=AUTH, timeout=180)
    assert answer.status_code == 200, (model, answer.status_code, answer.text)
    document: dict[str, Any] = answer.json()
    return document


def exits_since(client: docker.DockerClient, container: str, since: int) -> list[dict[str, Any]]:
    """The engine's ``die`` events of ``container`` since ``since`` (epoch seconds)."""
    return list(
        client.events(
            since=since,
            until=int(time.time()) + 1,
            decode=True,
            filters={"type": "container", "event": "die", "container": container},
        )
    )


def post_completion(model: str) -> int:
    """A short completion through the published port; its HTTP status."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "switchyard": LONG_DEADLINE}
    return httpx.post(f"{INGRESS}/v1/completions", json=body, headers=AUTH, timeout=180).status_code


def completion_status(request_id: str) -> tuple[str, int | str]:
    """A short completion with a client-chosen id; its HTTP status, or what went wrong."""
    body = {
        "model": "llama-2-7b",
        "prompt": "Hello",
        "max_tokens": 4,
        "switchyard": {**LONG_DEADLINE, "request_id": request_id},
    }
    try:
        answer = httpx.post(f"{INGRESS}/v1/completions", json=body, headers=AUTH, timeout=120)
    except httpx.HTTPError as error:
        return request_id, f"{type(error).__name__}: {error}"
    return request_id, answer.status_code


def request_states(request_ids: list[str]) -> dict[str, Any]:
    """``GET /v1/requests/{id}`` of each: the recorded state of calls that went wrong."""
    states: dict[str, Any] = {}
    for request_id in request_ids[:10]:
        found = httpx.get(f"{INGRESS}/v1/requests/{request_id}", headers=AUTH, timeout=30)
        states[request_id] = found.json() if found.status_code == 200 else found.status_code
    return states


def call_every(
    pool: ThreadPoolExecutor, every_s: float, stop: threading.Event, call: Callable[[], T]
) -> list[Future[T]]:
    """Submit ``call`` to the pool every ``every_s`` until ``stop``; the calls' futures."""
    calls: list[Future[T]] = []
    while not stop.is_set():
        calls.append(pool.submit(call))
        time.sleep(every_s)
    return calls


def test_every_service_is_up_and_every_health_endpoint_answers(
    stack: docker.DockerClient, workers: Workers
) -> None:
    running = project_containers(stack)
    services = {service_of(c) for c in running}
    infrastructure = {"kafka", "redis", "otel-collector", "jaeger", "proxy", "prometheus"}
    assert services >= SWITCHYARD_SERVICES | infrastructure
    assert len(project_containers(stack, "worker-llm")) == 2
    for container in running:
        health = container.attrs["State"].get("Health")
        if health is not None:
            assert health["Status"] == "healthy", (container.name, health["Log"][-1:])
        if service_of(container) in SWITCHYARD_SERVICES:
            output = probe(container, "/healthz", "/readyz")
            assert "/healthz 200" in output, output
            assert "/readyz 200" in output, output
    (job,) = project_containers(stack, "registry", stopped=True)
    assert job.attrs["State"]["ExitCode"] == 0, job.logs()[-2000:]

    assert httpx.get(f"{INGRESS}/healthz", timeout=10).status_code == 200
    # Metrics are on each replica's health port, not on the API's.
    assert httpx.get(f"{INGRESS}/metrics", timeout=10).status_code == 404
    (ingress,) = project_containers(stack, "ingress")
    assert "/metrics 200" in probe(ingress, "/metrics")
    # The API wants the demo tenant's key.
    assert httpx.get(f"{INGRESS}/v1/models", timeout=10).status_code == 401
    models = httpx.get(f"{INGRESS}/v1/models", headers=AUTH, timeout=10).json()
    assert {"llama-2-7b", "llama-2-13b", "tiny-lm"} <= {m["id"] for m in models["data"]}
    # Redis and Kafka through the ports published for tools on the host.
    assert workers.redis.ping()

    async def topics() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=KAFKA)
        await admin.start()
        try:
            return list(await admin.list_topics())
        finally:
            await admin.close()

    assert any("requests" in t for t in asyncio.run(topics()))
    # The collector takes an (empty) OTLP/HTTP export; Jaeger's query port answers.
    exported = httpx.post(
        f"{COLLECTOR}/v1/metrics",
        content=b"",
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert exported.status_code == 200, exported.text
    assert httpx.get(f"{JAEGER}/api/services", timeout=10).status_code == 200


def test_completions_run_on_the_emulated_workers_and_tiny_lm_on_the_torch_worker(
    stack: docker.DockerClient,
) -> None:
    hosts = {
        service: {hostname_of(c) for c in project_containers(stack, service)}
        for service in ("worker-llm", "worker-llm-13b", "worker-torch")
    }

    def served_by(document: dict[str, Any]) -> str:
        worker = str(document["switchyard"]["worker_id"])
        return next(s for s, names in hosts.items() if any(worker.startswith(n) for n in names))

    small = complete("llama-2-7b")
    assert small["switchyard"]["emulated"] is True
    assert served_by(small) == "worker-llm"
    assert small["usage"]["completion_tokens"] >= 1, small
    large = complete("llama-2-13b")
    assert served_by(large) == "worker-llm-13b"
    tiny = complete("tiny-lm", max_tokens=12)
    assert tiny["switchyard"]["emulated"] is False
    assert served_by(tiny) == "worker-torch"
    assert tiny["usage"]["completion_tokens"] >= 1


def test_classification_calls_run_on_the_torch_worker(stack: docker.DockerClient) -> None:
    """Every call answered with a label: by the torch worker's model, or by the
    estimator's own prediction where SneakPeek's plan short-circuits a call; every
    application's calls reach the torch worker."""
    torch_hosts = {hostname_of(c) for c in project_containers(stack, "worker-torch")}
    plan = build_plan(resolve_trace("azure-conv-sample"), "classification", 30, 0)
    ran_on_torch: Counter[str] = Counter()
    for planned in plan:
        answer = httpx.post(
            f"{INGRESS}/v1/apps/{planned.app}/infer",
            json={"features": list(planned.features), "switchyard": LONG_DEADLINE},
            headers=AUTH,
            timeout=120,
        )
        assert answer.status_code == 200, (planned.app, answer.text)
        document = answer.json()
        assert document["label"] is not None, document
        worker = str(document["worker_id"])
        if worker != SHORT_CIRCUIT_WORKER:
            assert any(worker.startswith(h) for h in torch_hosts), (worker, torch_hosts)
            ran_on_torch[planned.app] += 1
    assert set(ran_on_torch) == {"digits", "fraud-like", "wine-dominant"}, ran_on_torch


def test_a_streamed_chat_arrives_in_chunks(stack: docker.DockerClient) -> None:
    body = {
        "model": "llama-2-7b",
        "messages": [{"role": "user", "content": "Stream to me from a container"}],
        "max_tokens": 24,
        "stream": True,
        "switchyard": LONG_DEADLINE,
    }
    events: list[str] = []
    with httpx.stream(
        "POST", f"{INGRESS}/v1/chat/completions", json=body, headers=AUTH, timeout=120
    ) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 3, chunks
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "switchyard" in chunks[-1], chunks[-1]


def test_worker_llm_scales_up_the_new_worker_takes_work_and_scaled_down_one_drains(
    stack: docker.DockerClient, workers: Workers
) -> None:
    before = {c.name for c in project_containers(stack, "worker-llm")}
    # Calls keep coming while the new worker starts: every one answered.
    with ThreadPoolExecutor(max_workers=16) as pool:
        stop = threading.Event()
        numbers = itertools.count()
        trickle = pool.submit(
            call_every, pool, 0.1, stop, lambda: completion_status(f"scale-up-{next(numbers)}")
        )
        time.sleep(1)
        scale("worker-llm", 3)
        time.sleep(2)
        stop.set()
        during = dict(call.result(timeout=200) for call in trickle.result())
    unanswered = {rid: status for rid, status in during.items() if status != 200}
    # For each, what the ingress knows of it (its record), and the services' logs.
    if unanswered:
        # pytest cuts a long assertion message short: the records and the workers' and
        # the monitor's logs go out whole first.
        print(json.dumps(request_states(list(unanswered)), indent=2, default=str))
        print(compose("logs", "--no-color", "--tail", "300", "worker-llm", "monitor").stdout)
    assert unanswered == {}, (unanswered, request_states(list(unanswered)), why())
    replicas = project_containers(stack, "worker-llm")
    assert len(replicas) == 3
    (new,) = [c for c in replicas if c.name not in before]
    new_id = workers.id_of(new)

    # The new worker takes a share of what comes next.
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda _: complete("llama-2-7b", 32), range(24)))
    served = Counter(str(a["switchyard"]["worker_id"]) for a in answers)
    assert served[new_id] >= 1, (new_id, served)

    # Long requests on every replica, then back to two: the removed one drains.
    ids = {c.name: workers.id_of(c) for c in replicas}
    with ThreadPoolExecutor(max_workers=30) as pool:
        calls = [pool.submit(complete, "llama-2-7b", 400) for _ in range(30)]
        workers.wait_running(list(ids.values()))
        since = int(time.time()) - 1
        stopped_at_s = time.time()
        scale("worker-llm", 2, wait=False)
        long_answers = [call.result(timeout=180) for call in calls]
    remaining = {c.name for c in project_containers(stack, "worker-llm")}
    (removed,) = set(ids) - remaining
    removed_id = ids[removed]
    details = why()

    # It stopped on its own (SIGTERM, drain, exit 0) within the grace period.
    died = exits_since(stack, str(removed), since)
    assert [e["Actor"]["Attributes"]["exitCode"] for e in died] == ["0"], (died, details)
    # What ran on it when it was told to stop finished there, after the stop.
    finished_there = [
        a
        for a in long_answers
        if a["switchyard"]["worker_id"] == removed_id
        and a["switchyard"]["timeline"]["finished_s"] > stopped_at_s
    ]
    assert finished_there, (removed_id, Counter(a["switchyard"]["worker_id"] for a in long_answers))
    workers.wait_status(removed_id, "drained")
    events = asyncio.run(read_topic(KAFKA, "", WORKER_EVENTS))
    reasons = [e.message.reason for e in events if e.message.worker_id == removed_id]
    assert reasons in (["draining", "drained"], ["drained"]), (reasons, details)
    print(
        f"\nscale: {removed} drained, {len(finished_there)} running requests finished on it "
        "after SIGTERM"
    )


def test_ingress_replicas_scale_behind_the_one_published_port(stack: docker.DockerClient) -> None:
    """The proxy spreads calls over every ingress replica, and a replica scaled away
    drains without a call refused or lost."""
    scale("ingress", 2)
    replicas = project_containers(stack, "ingress")
    assert len(replicas) == 2
    before = {str(c.name): ingress_calls(c) for c in replicas}
    # The proxy finds the new replica by DNS within a second or two.
    deadline_s = time.monotonic() + 30
    with ThreadPoolExecutor(max_workers=4) as pool:
        while True:
            answers = list(pool.map(lambda _: complete("llama-2-7b", 4), range(8)))
            assert all(a["object"] == "text_completion" for a in answers)
            taken = {str(c.name): ingress_calls(c) - before[str(c.name)] for c in replicas}
            if min(taken.values()) >= 1 or time.monotonic() > deadline_s:
                break
    assert min(taken.values()) >= 1, (taken, why())

    # Back to one while calls keep coming: every one is answered 200.
    since = int(time.time()) - 1
    with ThreadPoolExecutor(max_workers=12) as pool:
        stop = threading.Event()
        trickle = pool.submit(call_every, pool, 0.05, stop, lambda: post_completion("llama-2-7b"))
        time.sleep(1)
        scale("ingress", 1, wait=False)
        time.sleep(2)
        stop.set()
        statuses = Counter(call.result(timeout=180) for call in trickle.result())
    (removed,) = {str(c.name) for c in replicas} - {
        str(c.name) for c in project_containers(stack, "ingress")
    }
    died = exits_since(stack, removed, since)
    assert [e["Actor"]["Attributes"]["exitCode"] for e in died] == ["0"], (died, why())
    assert set(statuses) == {200}, (statuses, why())
    print(
        f"\ningress: 2 replicas behind :8080 took {taken} calls; {removed} scaled away "
        f"during {sum(statuses.values())} calls, all answered 200"
    )


async def test_a_killed_worker_container_loses_no_request_and_runs_none_twice(
    stack: docker.DockerClient, workers: Workers
) -> None:
    # Three replicas, so that the two left after the kill keep up with the replay: the
    # compose file leaves admission control on, and an overloaded stack would refuse
    # some requests (429) instead of queueing them.
    scale("worker-llm", 3)
    replicas = project_containers(stack, "worker-llm")
    ids = {c.name: workers.id_of(c) for c in replicas}
    plan = build_plan(resolve_trace("azure-conv-sample"), "llm", 120, 0)
    speedup = 2.5
    task = asyncio.create_task(
        replay(
            plan,
            INGRESS,
            speedup=speedup,
            timeout_s=120,
            progress=False,
            api_key=COMPOSE_DEMO_API_KEY,
        )
    )
    try:
        await asyncio.sleep(third_of_the_way_s(plan, speedup))
        held = {
            name: int(workers.redis.zcard(f"switchyard:worker:{wid}:assigned"))
            for name, wid in ids.items()
        }
        victim = max(replicas, key=lambda c: held[str(c.name)])
        killed_at_s = time.time()
        victim.kill()  # SIGKILL, as `docker kill` sends it
        result = await task
    except BaseException:
        task.cancel()
        raise
    killed_id = ids[str(victim.name)]
    details = why()
    victim.reload()

    statuses = Counter(r.status_code for r in result.records)
    request_ids = [r.request_id for r in result.records]
    assert len(request_ids) == len(set(request_ids)) == len(plan)
    assert statuses == {200: len(plan)}, (statuses, details)

    wanted = set(request_ids)
    answers, inbox, events = await asyncio.gather(
        read_topic(KAFKA, "", ANSWERS),
        read_topic(KAFKA, "", WORKER_INBOX),
        read_topic(KAFKA, "", WORKER_EVENTS),
    )
    runs: dict[str, set[tuple[str, int]]] = {}
    for record in answers:
        message = record.message
        if (
            isinstance(message, Completion)
            and message.request_id in wanted
            and message.status is CompletionStatus.OK
        ):
            runs.setdefault(message.request_id, set()).add((message.worker_id, message.epoch))
    doubled = {rid: seen for rid, seen in runs.items() if len(seen) > 1}
    assert doubled == {}, (doubled, details)
    downs = [e.message for e in events if e.message.worker_id == killed_id]
    assert downs, (killed_id, details)
    orphans = {o for d in downs for o in d.orphaned_request_ids} & wanted
    reassigned = {
        a.message.request.request_id
        for a in inbox
        if isinstance(a.message, Assignment)
        and a.message.request.request_id in orphans
        and a.message.epoch >= 1
        and a.message.worker_id != killed_id
    }
    # Each was re-assigned to another worker, unless the killed one had finished it
    # (published its answer) before it died.
    finished_by_killed = {rid for rid, seen in runs.items() if any(w == killed_id for w, _ in seen)}
    assert orphans - reassigned <= finished_by_killed, (orphans - reassigned, details)
    detection_s = min(e.timestamp_ms for e in events if e.message.worker_id == killed_id) / 1000
    print(
        f"\nkill: {victim.name} ({killed_id}) SIGKILLed; {len(plan)} requests answered once, "
        f"{len(reassigned)} of {len(orphans)} orphans re-assigned (the others finished before "
        f"the kill), detected after {detection_s - killed_at_s:.1f} s; "
        f"the container is {victim.status} now (restart policy unless-stopped)"
    )


def test_the_loadgen_profile_replays_a_trace_sample(stack: docker.DockerClient) -> None:
    done = compose("--profile", "loadgen", "run", "--rm", "loadgen", timeout_s=600, check=False)
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
    # Every request answered: served, or refused by admission control (429, safe to retry).
    assert "llama-2-7b   300" in done.stdout, done.stdout[-4000:]
    assert "timeouts: 0; transport errors: 0" in done.stdout, done.stdout[-4000:]
    print("\n" + done.stdout[-2500:])


def test_prometheus_has_data_for_every_dashboard_panel_and_loads_every_rule(
    stack: docker.DockerClient,
) -> None:
    # After the calls and the loadgen replay above; Prometheus scrapes every 5 s.
    def empty_panels() -> list[tuple[str, str]]:
        return [
            (title, expr)
            for title, expr in panel_queries("5m")
            if not httpx.get(
                f"{PROMETHEUS}/api/v1/query", params={"query": expr}, timeout=10
            ).json()["data"]["result"]
        ]

    deadline = time.monotonic() + 60
    while (empty := empty_panels()) and time.monotonic() < deadline:
        time.sleep(5)
    assert empty == [], empty
    groups = httpx.get(f"{PROMETHEUS}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == alert_names(), rules
    assert all(rule["health"] == "ok" for rule in rules), rules
    up = httpx.get(f"{PROMETHEUS}/api/v1/query", params={"query": "up"}, timeout=10).json()
    scraped = {r["metric"]["service"] for r in up["data"]["result"] if r["value"][1] == "1"}
    assert scraped == SWITCHYARD_SERVICES, scraped


def test_the_calls_traces_reach_jaeger(stack: docker.DockerClient) -> None:
    deadline = time.monotonic() + 60
    services: list[str] = []
    while time.monotonic() < deadline:
        services = httpx.get(f"{JAEGER}/api/services", timeout=10).json()["data"] or []
        if any("ingress" in s for s in services) and any("worker" in s for s in services):
            break
        time.sleep(2)
    ingress = next((s for s in services if "ingress" in s), None)
    assert ingress is not None, services
    traces = httpx.get(
        f"{JAEGER}/api/traces", params={"service": ingress, "limit": "5"}, timeout=10
    ).json()["data"]
    assert traces, services
    # A request's trace spans services: the ingress and at least one other.
    spanning = [t for t in traces if len({p["serviceName"] for p in t["processes"].values()}) > 1]
    assert spanning, [sorted(p["serviceName"] for p in t["processes"].values()) for t in traces]


def test_down_leaves_no_container_network_or_volume(stack: docker.DockerClient) -> None:
    compose("--profile", "loadgen", "down", "--volumes", "--remove-orphans", "--timeout", "20")
    assert leftovers(stack) == {"containers": [], "networks": [], "volumes": []}
