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
5. a worker container SIGKILLed (``docker kill``) mid-replay, and another cut off the
   network (``docker network disconnect`` past the worker timeout, then ``connect``):
   every request answered once, none run twice, the victim's requests re-assigned, the
   cut-off one alive again once back;
6. each service, Kafka and Redis crashing in turn (SIGKILL of its container's main
   process) while calls keep coming: restarted by the restart policy, every call
   answered once (retried with its id where it failed);
7. the compose file's ``loadgen`` profile; traces of the calls found in Jaeger;
8. ``docker compose down -v``: no container, network or volume of the project left.

The steps share one stack (a module fixture) and run in file order.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from docker.models.containers import Container
from switchyard.config import load_settings
from switchyard.contracts.topics import WORKER_EVENTS
from switchyard.traces import resolve_trace

from loadgen.harness.process_stack import read_topic
from loadgen.mixes import PlannedRequest, build_plan
from loadgen.replay import new_run_id
from services.scheduler.windows import SHORT_CIRCUIT_WORKER
from tests.containers.calls import (
    LONG_DEADLINE,
    call_every,
    complete,
    completion_status,
    exits_since,
    post_completion,
    request_states,
    why,
)
from tests.containers.service_crash import answered, crash, wait_restarted
from tests.containers.stack import (
    AUTH,
    COLLECTOR,
    IMAGES,
    INGRESS,
    JAEGER,
    KAFKA,
    PROJECT,
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
from tests.containers.worker_faults import (
    REQUESTS,
    WorkerFault,
    WorkerFaultOutcome,
    ok_runs,
    replay_with_worker_fault,
    worker_fault_outcome,
)
from tests.support.dashboard import alert_names, panel_queries

WORKER_TIMEOUT_S = load_settings({}).worker_timeout_s
"""The compose file leaves the worker timeout at its default."""
# Builds (several minutes cold), start-up and the scenario share the first test's limit.
pytestmark = pytest.mark.timeout(3600)

SWITCHYARD_SERVICES = {
    "ingress",
    "monitor",
    "predictor",
    "estimator",
    "scheduler",
    "rebalancer",
    "placement",
    "worker-llm",
    "worker-llm-13b",
    "worker-models",
    "worker-torch",
}


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
            json={"features": list(planned.features), **LONG_DEADLINE},
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


def test_a_pipeline_runs_its_stages_on_the_models_the_placement_service_loads(
    stack: docker.DockerClient,
) -> None:
    """Nothing is placed at start: the first calls wait for the placement service to load
    the models (the catalogue's load times, at the file's time scale of 1), then every
    stage runs on a worker-models container."""
    hosts = {hostname_of(c) for c in project_containers(stack, "worker-models")}
    # Longer than the ingress's answer timeout (300 s): a call that stalls gets its 504,
    # which names the stages still pending, rather than a client-side timeout.
    answer = httpx.post(
        f"{INGRESS}/v1/apps/txt2img-hd/infer",
        json={"input": "a lighthouse at dusk"},
        headers=AUTH,
        timeout=330,
    )
    assert answer.status_code == 200, (answer.text, why())
    body = answer.json()
    assert set(body["output"]) == {"upscale", "check"}
    assert [s["stage"] for s in body["stages"]][:2] == ["encode", "generate"]
    for stage in body["stages"]:
        assert any(stage["worker_id"].startswith(h) for h in hosts), (stage, hosts)


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
        sent_s = time.time()
        calls = [pool.submit(complete, "llama-2-7b", 400) for _ in range(30)]
        workers.wait_running(list(ids.values()), since_s=sent_s)
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


async def settled(fault: WorkerFault, details: str) -> tuple[WorkerFaultOutcome, float]:
    """Assert that every request was answered once and run once, and that the victim's
    requests moved to other workers unless it had answered them; the outcome, and the
    seconds from the fault to the monitor's ``WorkerDown``."""
    statuses = Counter(r.status_code for r in fault.result.records)
    request_ids = [r.request_id for r in fault.result.records]
    assert len(request_ids) == len(set(request_ids)) == REQUESTS
    assert statuses == {200: REQUESTS}, (statuses, details)
    outcome = await worker_fault_outcome(fault)
    assert outcome.ran_twice == {}, (outcome.ran_twice, details)
    assert outcome.detected_at_s is not None, (fault.victim_id, details)
    missed = outcome.orphans - outcome.reassigned
    assert missed <= outcome.finished_by_victim, (missed, details)
    return outcome, outcome.detected_at_s - fault.injected_at_s


async def test_a_killed_worker_container_loses_no_request_and_runs_none_twice(
    stack: docker.DockerClient, workers: Workers
) -> None:
    # Three replicas, so that the two left after the kill keep up with the replay: the
    # compose file leaves admission control on, and an overloaded stack would refuse
    # some requests (429) instead of queueing them.
    scale("worker-llm", 3)
    fault = await replay_with_worker_fault(stack, workers, lambda c: c.kill())  # `docker kill`
    details = why()
    fault.victim.reload()
    outcome, detection_s = await settled(fault, details)
    print(
        f"\nkill: {fault.victim.name} ({fault.victim_id}) SIGKILLed holding {fault.held}; "
        f"{REQUESTS} requests "
        f"answered once, {len(outcome.reassigned)} of {len(outcome.orphans)} orphans "
        f"re-assigned (the others finished before the kill), detected after "
        f"{detection_s:.1f} s; the container is "
        f"{fault.victim.status} now (restart policy unless-stopped)"
    )


async def test_a_worker_container_cut_off_from_the_network_loses_nothing_and_runs_none_twice(
    stack: docker.DockerClient, workers: Workers
) -> None:
    # The killed worker's replica started again: three live workers, as above.
    scale("worker-llm", 3)
    network = stack.networks.get(f"{PROJECT}_default")

    def cut(container: Container) -> None:
        """``docker network disconnect`` past the worker timeout, then connect again."""
        network.disconnect(container)
        time.sleep(WORKER_TIMEOUT_S + 3.0)
        network.connect(container, aliases=["worker-llm"])

    fault = await replay_with_worker_fault(stack, workers, cut)
    details = why()
    # While it was cut off the monitor declared it down and its requests moved; what it
    # went on running there was refused by the ledger's fence when it came back.
    outcome, detection_s = await settled(fault, details)
    # What it held when cut off could not be recorded finished: it moved.
    assert fault.held > 0, details
    assert outcome.orphans, (fault.held, details)
    # Back on the network, it reports again and the monitor records it alive.
    back = time.monotonic()
    workers.wait_status(fault.victim_id, "alive", timeout_s=60)
    print(
        f"\nnetwork cut: {fault.victim.name} ({fault.victim_id}) holding {fault.held} off the "
        "network for "
        f"{WORKER_TIMEOUT_S + 3:g} s; {REQUESTS} requests answered once, "
        f"{len(outcome.reassigned)} of {len(outcome.orphans)} orphans re-assigned, detected "
        f"after {detection_s:.1f} s; alive again {time.monotonic() - back:.1f} s after the "
        "replay"
    )


CRASH_PLAN = build_plan(
    resolve_trace("azure-mix-sample"), "mixed", 600, 0, classification_share=0.5
)
"""Calls made while a service crashes: short LLM completions and classification calls."""


def crash_calls(run_id: str) -> list[tuple[PlannedRequest, str]]:
    """The crash plan's calls three laps over, each lap under its own run id: more than
    the trickle makes in the longest restart the test waits for (120 s at 10 calls a
    second; Kafka's takes about a minute), with every id distinct. A list, not a
    generator: the pool's threads draw from it at once."""
    return [(request, f"{run_id}-lap{lap}") for lap in range(3) for request in CRASH_PLAN]


@pytest.mark.parametrize(
    "service",
    ["monitor", "scheduler", "estimator", "predictor", "rebalancer", "ingress", "kafka", "redis"],
)
async def test_a_crashed_service_is_restarted_and_every_call_is_answered_once(
    stack: docker.DockerClient, service: str
) -> None:
    victim = project_containers(stack, service)[0]
    plan = iter(crash_calls(new_run_id()))
    with ThreadPoolExecutor(max_workers=24) as pool:
        stop = threading.Event()
        trickle = pool.submit(call_every, pool, 0.1, stop, lambda: answered(*next(plan)))
        await asyncio.sleep(1.5)
        restarts = crash(victim)
        back_s = await asyncio.to_thread(wait_restarted, victim, restarts)
        await asyncio.sleep(1.5)
        stop.set()
        calls = [call.result(timeout=200) for call in trickle.result()]
    details = why()
    unanswered = {rid: (status, tries) for rid, status, tries in calls if status != 200}
    assert unanswered == {}, (unanswered, details)
    runs = await ok_runs({rid for rid, _, _ in calls})
    ran_twice = {rid: seen for rid, seen in runs.items() if len(seen) > 1}
    assert ran_twice == {}, (ran_twice, details)
    retried = sum(1 for _, _, tries in calls if tries > 1)
    print(
        f"\n{service} crashed (SIGKILL of its main process): restarted and healthy after "
        f"{back_s:.1f} s; {len(calls)} calls answered once ({retried} after a retry)"
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
