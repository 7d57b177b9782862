"""What docker-compose.yml promises an operator, read from the file: host ports that
never meet the local development ones, one fixed ingress port, and only the services
that read the classification registry waiting for the job that builds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
LOCAL_PORTS = {9092, 9093, 6379}
"""Kafka (client and controller) and Redis of deploy/local/infra.sh and `make test`."""
REGISTRY_READERS = {
    "ingress",
    "estimator",
    "scheduler",
    "placement",
    "worker-models",
    "worker-torch",
}


def _services() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    services: dict[str, Any] = document["services"]
    return services


def _host_ports(spec: dict[str, Any]) -> list[str]:
    return [str(mapping).split(":")[0] for mapping in spec.get("ports", [])]


def test_no_host_port_meets_the_local_infrastructure() -> None:
    published = {name: _host_ports(spec) for name, spec in _services().items()}
    for name, ports in published.items():
        assert all("-" not in port for port in ports), (name, ports)  # no port ranges
        assert not {int(port) for port in ports} & LOCAL_PORTS, (name, ports)
    # The API on one fixed port, whatever the number of ingress replicas behind it.
    assert published["proxy"] == ["8080"]
    assert published["ingress"] == []


def test_the_proxy_checks_and_fronts_every_ingress_replica() -> None:
    services = _services()
    ingress, proxy = services["ingress"], services["proxy"]
    config = (ROOT / "deploy/haproxy/haproxy.cfg").read_text(encoding="utf-8")
    port = ingress["environment"]["SWITCHYARD_HTTP_PORT"]
    assert f"server-template ingress 10 ingress:{port}" in config
    assert "option httpchk GET /healthz" in config
    # A stopping replica fails the check (every 1 s) before it refuses calls.
    assert "inter 1s" in config
    assert float(ingress["environment"]["SWITCHYARD_DRAIN_NOTICE_S"]) > 1
    mounted = "./deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"
    assert mounted in proxy["volumes"]
    assert "http://proxy:8080" in services["loadgen"]["command"]


def test_kafka_advertises_the_host_port_it_publishes() -> None:
    kafka = _services()["kafka"]
    (host_port,) = _host_ports(kafka)
    assert f"EXTERNAL://localhost:{host_port}" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"EXTERNAL://:{host_port}" in kafka["environment"]["KAFKA_LISTENERS"]


def test_only_the_registry_readers_wait_for_the_registry_job() -> None:
    waiting = {
        name for name, spec in _services().items() if "registry" in (spec.get("depends_on") or {})
    }
    assert waiting == REGISTRY_READERS
    for name in REGISTRY_READERS:
        mounts = _services()[name]["volumes"]
        assert "registry:/var/lib/switchyard/registry:ro" in mounts, name


def test_the_registry_job_when_built_already_needs_neither_torch_nor_scikit_learn(
    tmp_path: Path,
) -> None:
    (tmp_path / "registry.json").write_text("{}", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "sys.modules['torch'] = sys.modules['sklearn'] = None\n"
            "from cli.main import main\n"
            f"main(['apps', 'build', '--out', {str(tmp_path)!r}, '--if-missing'])\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "exists already; nothing to do" in done.stdout


def test_prometheus_scrapes_every_service_and_loads_the_chart_s_rules() -> None:
    services = _services()
    switchyard = {
        name for name, spec in services.items() if spec.get("command", [None])[0] == "service"
    }
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (dns,) = job["dns_sd_configs"]
    assert set(dns["names"]) == switchyard
    assert dns["port"] == 8081
    mounts = services["prometheus"]["volumes"]
    assert "./deploy/helm/switchyard/files/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
