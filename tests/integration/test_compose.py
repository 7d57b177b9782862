"""docker-compose.yml cannot drift from the code: every project service it declares runs
here as a local process, with the file's own command and environment, against the real
Kafka and Redis, and a short mixed trace is replayed through it.

What differs from a container, and why:

- host names are mapped to this machine: ``kafka:29092`` to the local broker and
  ``redis`` to the local Redis; the OpenTelemetry collector is not running here, so
  ``SWITCHYARD_OTLP_ENDPOINT`` is left out;
- every process gets the test's topic and key prefix, a free health port on the loopback
  address (containers each have their own 8081, open to the compose network) and the
  ingress a free HTTP port;
- the registry volume is a temporary folder, filled by the file's own ``registry`` job;
- the emulated workers run 20 times faster than the file's real time, so the replay
  takes seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from switchyard.traces import resolve_trace

from loadgen.harness.process_stack import REPO_ROOT, ProcessStack
from loadgen.mixes import build_plan
from loadgen.replay import replay
from tests.containers.stack import COMPOSE_DEMO_API_KEY

COMPOSE = REPO_ROOT / "docker-compose.yml"
REGISTRY_MOUNT = "/var/lib/switchyard/registry"
# Set per process by the test harness instead (see the module docstring).
HARNESS_VARIABLES = frozenset(
    {
        "SWITCHYARD_OTLP_ENDPOINT",
        "SWITCHYARD_HTTP_PORT",
        "SWITCHYARD_HEALTH_PORT",
        "SWITCHYARD_HEALTH_HOST",
    }
)


def compose_services() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services: dict[str, Any] = document["services"]
    return services


def project_services(services: dict[str, Any]) -> dict[str, Any]:
    """The services built from this repository's image that run a Switchyard service."""
    return {
        name: spec
        for name, spec in services.items()
        if str(spec.get("image", "")).startswith("switchyard:")
        and spec.get("command", [None])[0] == "service"
        and "profiles" not in spec
    }


def local_env(
    environment: dict[str, Any], kafka_bootstrap: str, redis_url: str, registry: Path
) -> dict[str, str]:
    env: dict[str, str] = {}
    for key, value in environment.items():
        if key in HARNESS_VARIABLES:
            continue
        # Compose's ${NAME:-default}, as `docker compose` expands it.
        text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1]) or m[2], str(value))
        text = text.replace("kafka:29092", kafka_bootstrap)
        text = text.replace("redis://redis:6379/0", redis_url)
        text = text.replace(REGISTRY_MOUNT, str(registry))
        env[key] = text
    env["SWITCHYARD_WORKER_TIME_SCALE"] = "20"
    return env


def test_every_project_service_in_the_compose_file_is_a_known_service() -> None:
    from services.catalog import SERVICE_NAMES

    services = project_services(compose_services())
    assert {spec["command"][1] for spec in services.values()} == set(SERVICE_NAMES)
    for name, spec in services.items():
        # Configuration only through environment variables, all of them ours.
        assert all(key.startswith("SWITCHYARD_") for key in spec["environment"]), name
        # Every setting the file names exists (a renamed setting would fail here).
        from switchyard.config import Settings

        for key in spec["environment"]:
            assert key.removeprefix("SWITCHYARD_").lower() in Settings.model_fields, (name, key)


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """The registry volume, filled by the compose file's own one-off ``registry`` job."""
    folder = tmp_path / "registry"
    job = [
        str(a).replace(REGISTRY_MOUNT, str(folder))
        for a in compose_services()["registry"]["command"]
    ]
    built = subprocess.run(
        [sys.executable, "-m", "cli", *job],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return folder


async def test_the_compose_stack_runs_as_local_processes_and_answers_a_replay(
    kafka_bootstrap: str, redis_url: str, registry: Path, tmp_path: Path
) -> None:
    services = compose_services()
    stack = ProcessStack(
        kafka_bootstrap,
        redis_url,
        f"compose-{uuid.uuid4().hex[:8]}",
        tmp_path / "logs",
        time_scale=20.0,
    )
    workers = 0
    try:
        for name, spec in project_services(services).items():
            service = spec["command"][1]
            env = local_env(spec["environment"], kafka_bootstrap, redis_url, registry)
            replicas = int(spec.get("deploy", {}).get("replicas", 1))
            for index in range(replicas):
                stack.start_service(service, name=f"{name}-{index}", env=env)
                workers += service == "worker"
        await stack.wait_ready(workers=workers, timeout_s=180)
        plan = build_plan(
            resolve_trace("azure-mix-sample"), "mixed", 60, 0, classification_share=0.3
        )
        result = await replay(
            plan,
            stack.url,
            speedup=10.0,
            timeout_s=60,
            progress=False,
            api_key=COMPOSE_DEMO_API_KEY,
        )
        # The file leaves admission control on: a request whose deadline the stack
        # cannot meet may be refused (429 with Retry-After); anything else must be a 200.
        failures = [
            (r.request_id, r.status_code, r.error_message)
            for r in result.records
            if r.status_code not in (200, 429)
        ]
        assert failures == [], stack.logs()
        answered = sum(r.status_code == 200 for r in result.records)
        assert answered >= 0.9 * len(plan), (answered, stack.logs())
        served_by = {r.worker_id for r in result.records}
        # The classification requests ran on the torch worker, LLM ones on emulated ones.
        assert any(w and "worker-torch" in w for w in served_by), served_by
        assert any(w and "worker-llm" in w for w in served_by), served_by
        # Pipelines: every stage on the emulated-models workers the placement service
        # loaded the models on (nothing is placed before the first calls come).
        async with httpx.AsyncClient(
            base_url=stack.url,
            timeout=60.0,
            headers={"Authorization": f"Bearer {COMPOSE_DEMO_API_KEY}"},
        ) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/v1/apps/txt2img-hd/infer", json={"input": f"call {i}"})
                    for i in range(4)
                )
            )
        for answer in answers:
            assert answer.status_code == 200, (answer.text, stack.logs())
            body = answer.json()
            assert set(body["output"]) == {"upscale", "check"}
            assert [s["stage"] for s in body["stages"]][:2] == ["encode", "generate"]
            assert all("worker-models" in s["worker_id"] for s in body["stages"]), body
            assert body["emulated"] is True
    finally:
        codes = await stack.close()
    assert all(code == 0 for code in codes.values()), (codes, stack.logs())
