"""Rendering the Helm chart (deploy/helm/switchyard) and reading what it rendered, for the
chart's tests. helm comes from deploy/local/helm.sh (`make deps`); without it the tests
fail, saying so."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "switchyard"
HELM_SH = ROOT / "deploy" / "local" / "helm.sh"
TENANT_KEY_HASH = "a" * 64
TEST_TENANTS = ["--set-json", f'auth.apiKeys=["test={TENANT_KEY_HASH}"]']
"""The chart renders only with a tenant (or keys off): every render but the ones that
test exactly that gets this one."""

Manifest = dict[str, Any]


def run_script(command: str) -> str:
    done = subprocess.run(
        [str(HELM_SH), command], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"deploy/local/helm.sh {command} failed: {done.stderr.strip()}", pytrace=False)
    return done.stdout.strip()


@cache
def helm() -> str:
    return run_script("path")


def helm_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm(), *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


def template(*args: str, tenants: bool = True) -> subprocess.CompletedProcess[str]:
    extra = TEST_TENANTS if tenants else []
    return helm_run("template", "sy", str(CHART), "--namespace", "switchyard", *extra, *args)


@cache
def render(*args: str) -> tuple[Manifest, ...]:
    done = template(*args)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(manifests: tuple[Manifest, ...], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def component(manifest: Manifest) -> str:
    return str(manifest["metadata"]["labels"]["app.kubernetes.io/component"])


def deployments_of(manifests: tuple[Manifest, ...]) -> dict[str, Manifest]:
    return {component(d): d for d in of_kind(manifests, "Deployment")}


def main_container(deployment: Manifest) -> Manifest:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def env_of(deployment: Manifest, manifests: tuple[Manifest, ...]) -> dict[str, str]:
    """The variables the service starts with: its ConfigMaps, then its own `env`."""
    config_maps = {m["metadata"]["name"]: m for m in of_kind(manifests, "ConfigMap")}
    secrets = {m["metadata"]["name"]: m for m in of_kind(manifests, "Secret")}
    container = main_container(deployment)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]]["data"])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = "pod-name"
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            secret = secrets.get(ref["name"])
            # A Secret of one's own (all-options) is not rendered: stand in a valid URL.
            env[item["name"]] = (
                secret["stringData"][ref["key"]] if secret else "redis://redis.example:6379/0"
            )
    return env


def _strict(schema: Any) -> Any:
    """A CRD's schema refusing unknown fields, as `kubectl apply` with strict field
    validation does (the API server would otherwise drop a misspelled field silently)."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@cache
def keda_schema(plural: str) -> dict[str, Any]:
    """The schema of KEDA's ``keda.sh/v1alpha1`` resource ``plural`` (``scaledobjects``,
    ``triggerauthentications``) from its CRD, refusing unknown fields."""
    scaled_objects = Path(run_script("crd"))
    path = scaled_objects.with_name(f"keda.sh_{plural}.yaml")
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return dict(_strict(version["schema"]["openAPIV3Schema"]))
