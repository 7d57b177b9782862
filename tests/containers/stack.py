"""docker-compose.yml's stack as the container tests drive it: the project's images built
with the ``docker`` package, compose's own CLI for up, scale, run and down, and what the
tests read back (containers, health endpoints, worker records, topics).

The stack's host ports are the compose file's: the ingress on 8080, Kafka on 19092,
Redis on 16379, Jaeger's query port 16686 and the collector's OTLP/HTTP port 4318.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import docker
import redis
from docker.models.containers import Container

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = "deploy/docker/Dockerfile"
PROJECT = "switchyard"
"""The compose file's ``name``."""
INGRESS = "http://127.0.0.1:8080"
COMPOSE_DEMO_API_KEY = "sy-compose-demo-key-change-me"
"""The key of the compose file's demo tenant (its SWITCHYARD_API_KEYS default)."""
AUTH = {"Authorization": f"Bearer {COMPOSE_DEMO_API_KEY}"}
KAFKA = "127.0.0.1:19092"
REDIS = "redis://127.0.0.1:16379/0"
JAEGER = "http://127.0.0.1:16686"
PROMETHEUS = "http://127.0.0.1:9090"
COLLECTOR = "http://127.0.0.1:4318"
STATE_PREFIX = "switchyard:"
"""The services' Redis key prefix (the default; the compose file sets none)."""
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_INDEX = "https://pypi.org/simple"
CACHE = Path(os.environ.get("SWITCHYARD_CACHE_DIR") or Path.home() / ".cache/switchyard") / "docker"
IMAGES = {"core": "switchyard:core", "ml": "switchyard:ml"}
"""Dockerfile target -> the tag the compose file runs."""
HEALTH_PORT = 8081
PROBE = (
    "import sys, urllib.request\n"
    "for path in sys.argv[1:]:\n"
    f"    with urllib.request.urlopen('http://127.0.0.1:{HEALTH_PORT}' + path, timeout=5) as r:\n"
    "        print(path, r.status, r.read().decode())\n"
)
"""Run inside a container: its health server listens on loopback only."""


def record_timing(name: str, seconds: float) -> None:
    """Append to the timings log deploy/local/docker.sh also writes."""
    CACHE.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with (CACHE / "timings.log").open("a", encoding="utf-8") as log:
        log.write(f"{stamp} {name} {seconds:.0f}s status=0\n")


def torch_index() -> str:
    """SWITCHYARD_TORCH_INDEX_URL, else PyTorch's CPU index when it answers, else PyPI
    (whose wheel brings the CUDA libraries: a much larger image, but one that builds)."""
    configured = os.environ.get("SWITCHYARD_TORCH_INDEX_URL")
    if configured:
        return configured
    try:
        with urllib.request.urlopen(f"{TORCH_CPU_INDEX}/torch/", timeout=10):
            return TORCH_CPU_INDEX
    except (urllib.error.URLError, OSError):
        return PYPI_INDEX


def build_image(client: docker.DockerClient, target: str, buildargs: dict[str, str]) -> float:
    """Build ``target`` of the Dockerfile into its compose tag (the engine's layer cache
    makes a rebuild of unchanged layers instant); returns the seconds it took. The build's
    output goes to ``build-<target>.log`` in the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    log_path = CACHE / f"build-{target}.log"
    start = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        chunks: Iterator[dict[str, Any]] = client.api.build(
            path=str(ROOT),
            dockerfile=DOCKERFILE,
            target=target,
            tag=IMAGES[target],
            buildargs=buildargs,
            labels={"org.switchyard.build": target},
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in chunks:
            log.write(str(chunk.get("stream", "")))
            if "error" in chunk:
                log.write(str(chunk["error"]) + "\n")
                raise AssertionError(
                    f"building {IMAGES[target]} failed: {chunk['error']} ({log_path})"
                )
    seconds = time.monotonic() - start
    record_timing(f"image {IMAGES[target]}", seconds)
    # The image this tag named before, left untagged by a rebuild: disk, not cache.
    client.images.prune(filters={"dangling": True, "label": "org.switchyard.build"})
    return seconds


def compose(
    *args: str, timeout_s: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``docker compose`` on the repository's file; fails the test with its output when
    ``check`` and it exits non-zero."""
    command = ["docker", "compose", "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE)]
    done = subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=ROOT,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"docker compose {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def scale(service: str, replicas: int, *, wait: bool = True) -> None:
    """``service`` to ``replicas`` containers, the others left as they are; with
    ``wait``, until the new ones are healthy."""
    waiting = ["--wait"] if wait else []
    compose(
        "up", "--detach", "--no-deps", "--no-build", *waiting,
        "--scale", f"{service}={replicas}", service,
    )  # fmt: skip


def project_containers(
    client: docker.DockerClient, service: str | None = None, *, stopped: bool = False
) -> list[Container]:
    """The project's containers (of ``service``), running ones unless ``stopped``,
    by replica number."""
    labels = [f"com.docker.compose.project={PROJECT}"]
    if service is not None:
        labels.append(f"com.docker.compose.service={service}")
    found: list[Container] = client.containers.list(all=stopped, filters={"label": labels})
    return sorted(found, key=lambda c: (service_of(c), number_of(c)))


def service_of(container: Container) -> str:
    return str(container.labels.get("com.docker.compose.service", ""))


def number_of(container: Container) -> int:
    return int(container.labels.get("com.docker.compose.container-number", "0"))


def hostname_of(container: Container) -> str:
    return str(container.attrs["Config"]["Hostname"])


def probe(container: Container, *paths: str) -> str:
    """GET each path of the container's health endpoint from inside it; fails on a
    status other than 200."""
    exit_code, output = container.exec_run(["python", "-c", PROBE, *paths])
    assert isinstance(output, bytes)  # not streamed
    text = output.decode(errors="replace")
    assert exit_code == 0, (container.name, paths, text[-2000:])
    return text


def ingress_calls(container: Container) -> float:
    """The inference calls an ingress replica has answered (its /metrics, on the health
    port inside its container)."""
    metrics = f"http://127.0.0.1:{HEALTH_PORT}/metrics"
    exit_code, output = container.exec_run(
        [
            "python",
            "-c",
            f"import urllib.request; print(urllib.request.urlopen({metrics!r}).read().decode())",
        ]
    )
    assert isinstance(output, bytes)  # not streamed
    text = output.decode(errors="replace")
    assert exit_code == 0, (container.name, text[-2000:])
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("switchyard_ingress_requests")
    )


def leftovers(client: docker.DockerClient) -> dict[str, list[str]]:
    """The project's containers, networks and volumes that still exist."""
    label: dict[str, str | list[str] | bool] = {"label": f"com.docker.compose.project={PROJECT}"}
    return {
        "containers": [str(c.name) for c in client.containers.list(all=True, filters=label)],
        "networks": [str(n.name) for n in client.networks.list(filters=label)],
        "volumes": [str(v.name) for v in client.volumes.list(filters=label)],
    }


class Workers:
    """The workers' records in Redis, as the monitor and the workers keep them."""

    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(REDIS, decode_responses=True)

    def close(self) -> None:
        self.redis.close()

    def id_of(self, container: Container, timeout_s: float = 60.0) -> str:
        """The worker id a container's worker reports under (its host name first)."""
        prefix = f"{STATE_PREFIX}worker:{hostname_of(container)}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            keys = [k for k in self.redis.scan_iter(f"{prefix}*") if ":" not in k[len(prefix) :]]
            if keys:
                return str(keys[0]).removeprefix(f"{STATE_PREFIX}worker:")
            time.sleep(0.2)
        raise AssertionError(f"no worker record for {container.name} within {timeout_s:g} s")

    def field(self, worker_id: str, name: str) -> str | None:
        value = self.redis.hget(f"{STATE_PREFIX}worker:{worker_id}", name)
        return None if value is None else str(value)

    def heartbeat(self, worker_id: str) -> dict[str, Any]:
        raw = self.field(worker_id, "heartbeat")
        return {} if raw is None else dict(json.loads(raw))

    def wait_running(
        self, worker_ids: Sequence[str], since_s: float, timeout_s: float = 30.0
    ) -> None:
        """Until every worker's latest heartbeat, sent after ``since_s`` (wall clock), shows
        a request running: an older one may still list work that has finished since."""
        deadline = time.monotonic() + timeout_s
        idle = list(worker_ids)
        while time.monotonic() < deadline:
            beats = {w: self.heartbeat(w) for w in worker_ids}
            idle = [
                w
                for w, beat in beats.items()
                if float(beat.get("created_at_s", 0.0)) <= since_s
                or int(beat.get("running", 0)) == 0
            ]
            if not idle:
                return
            time.sleep(0.1)
        raise AssertionError(f"workers {idle} ran nothing within {timeout_s:g} s")

    def wait_status(self, worker_id: str, status: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.field(worker_id, "status") == status:
                return
            time.sleep(0.2)
        raise AssertionError(
            f"worker {worker_id} is {self.field(worker_id, 'status')!r}, not {status!r}"
        )
