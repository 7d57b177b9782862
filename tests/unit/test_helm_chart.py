"""The Helm chart (deploy/helm/switchyard) as a cluster would take it.

The chart is rendered with ``helm template``, with its defaults and with every option on,
and checked the way an API server and KEDA would check it: every manifest against the
Kubernetes schemas, every ScaledObject against KEDA's CRD with unknown fields refused.
Then against the code: its variables are settings the services read, with values they
accept; each service of docker-compose.yml has its Deployment, with the same command,
image and settings; the autoscalers' lag triggers name consumer groups and topics the
services really consume. helm and KEDA's CRD come from deploy/local/helm.sh (`make
deps`); without them these tests fail, saying so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from switchyard.config import ENV_PREFIX, Settings, load_settings
from switchyard.contracts import topics

from tests.support.helm_chart import (
    CHART,
    ROOT,
    TENANT_KEY_HASH,
    TEST_TENANTS,
    Manifest,
    component,
    deployments_of,
    env_of,
    helm_run,
    keda_schema,
    main_container,
    of_kind,
    render,
    template,
)

MONITORING_FILES = frozenset({"dashboard", "alert-rules"})
"""The ConfigMaps that carry files (the dashboard, the alerting rules), not settings."""

KNOWN_VARIABLES = frozenset(ENV_PREFIX + name.upper() for name in Settings.model_fields)

# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest the
# schemas know: an API removed or added in between fails one of them.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())

# What the chart sets itself rather than taking from `config` or a service's `env`: the
# transports and addresses, the ports its probes and Services use, each pod's id.
CHART_OWNED = frozenset(
    {
        "SWITCHYARD_BUS",
        "SWITCHYARD_STATE",
        "SWITCHYARD_KAFKA_BOOTSTRAP",
        "SWITCHYARD_KAFKA_SECURITY_PROTOCOL",
        "SWITCHYARD_REDIS_URL",
        "SWITCHYARD_HEALTH_HOST",
        "SWITCHYARD_HEALTH_PORT",
        "SWITCHYARD_INSTANCE_ID",
    }
)
# Left to its default, the instance id (the pod's name); SWITCHYARD_HTTP_PORT: the ingress's.
WORKER_ID, HTTP_PORT = "SWITCHYARD_WORKER_ID", "SWITCHYARD_HTTP_PORT"
# Compose's addresses name its own containers; the chart takes them as values.
ADDRESSES = frozenset(
    {"SWITCHYARD_KAFKA_BOOTSTRAP", "SWITCHYARD_REDIS_URL", "SWITCHYARD_OTLP_ENDPOINT"}
)
# Kafka's TLS and SASL: from `kafka` (the password a Secret, the CA a mounted Secret),
# set only when the protocol asks for them; client certificates are not in the chart.
KAFKA_SECURITY = frozenset(
    {
        "SWITCHYARD_KAFKA_SASL_MECHANISM",
        "SWITCHYARD_KAFKA_SASL_USERNAME",
        "SWITCHYARD_KAFKA_SASL_PASSWORD",
        "SWITCHYARD_KAFKA_SSL_CAFILE",
        "SWITCHYARD_KAFKA_SSL_CERTFILE",
        "SWITCHYARD_KAFKA_SSL_KEYFILE",
    }
)
# The ingress's API keys: from `auth` (a Secret), never from `config`.
AUTH_OWNED = frozenset({"SWITCHYARD_AUTH", "SWITCHYARD_API_KEYS", "SWITCHYARD_API_KEYS_FILE"})
# Compose only: its tenants' default, the drain notice its proxy needs (the chart's
# ingress has preStopSleepSeconds for the same end), and a group session shorter than a
# stock broker accepts (compose runs its own broker; the chart's may be anyone's).
COMPOSE_ONLY = frozenset(
    {"SWITCHYARD_API_KEYS", "SWITCHYARD_DRAIN_NOTICE_S", "SWITCHYARD_KAFKA_SESSION_TIMEOUT_MS"}
)

# Every option on: KEDA, the load generator, an extra trigger, a topic prefix, the Redis
# URL from a Secret of one's own, scheduling constraints, a collector.
ALL_OPTIONS: dict[str, Any] = {
    "config": {
        "SWITCHYARD_TOPIC_PREFIX": "blue.",
        "SWITCHYARD_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
        "SWITCHYARD_MAX_BODY_BYTES": 2097152,
        "SWITCHYARD_WINDOW_S": 0.05,
    },
    "redis": {"existingSecret": "switchyard-redis", "existingSecretKey": "url"},
    "image": {"pullSecrets": [{"name": "registry-credentials"}]},
    "pod": {
        "annotations": {"team": "inference"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "ingress": {"service": {"type": "LoadBalancer", "annotations": {"example.com/lb": "x"}}},
    "scheduler": {"autoscaling": {"enabled": True}},
    "workers": {
        "llm": {
            "autoscaling": {
                "enabled": True,
                "extraTriggers": [
                    {
                        "type": "prometheus",
                        "metadata": {
                            "serverAddress": "http://prometheus.monitoring:9090",
                            "query": "sum(switchyard_worker_queue_length)",
                            "threshold": "8",
                        },
                    }
                ],
            },
            "pod": {"nodeSelector": {"pool": "llm"}},
        },
        "llm-13b": {"autoscaling": {"enabled": True}},
        "torch": {"autoscaling": {"enabled": True}},
    },
    "loadgen": {"enabled": True, "apiKeySecret": "loadgen-key"},
}
VARIANTS = ("defaults", "all-options")


@pytest.fixture(scope="module")
def all_options_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("values") / "all-options.yaml"
    path.write_text(yaml.safe_dump(ALL_OPTIONS), encoding="utf-8")
    return path


def _values_args(variant: str, all_options_file: Path) -> list[str]:
    return ["-f", str(all_options_file)] if variant == "all-options" else []


@pytest.fixture(scope="module", params=VARIANTS)
def rendered(request: pytest.FixtureRequest, all_options_file: Path) -> tuple[Manifest, ...]:
    return render(*_values_args(request.param, all_options_file))


@pytest.fixture(scope="module")
def full(all_options_file: Path) -> tuple[Manifest, ...]:
    return render("-f", str(all_options_file))


def _compose_services() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return {
        name: spec
        for name, spec in document["services"].items()
        if list(spec.get("command", []))[:1] == ["service"]
    }


# -- helm itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_is_clean(variant: str, all_options_file: Path) -> None:
    done = helm_run(
        "lint", "--strict", str(CHART), *TEST_TENANTS, *_values_args(variant, all_options_file)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout, done.stdout
    assert "[ERROR]" not in done.stdout, done.stdout


# -- what the API server and KEDA accept ---------------------------------------------------


def test_every_manifest_validates_against_the_kubernetes_schemas(
    rendered: tuple[Manifest, ...],
) -> None:
    for manifest in rendered:
        if manifest["apiVersion"].startswith("keda.sh/"):
            continue  # a custom resource: KEDA's schema, below
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{name} on Kubernetes {version}: {path}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                pytest.fail(f"{name}: {exc.message}")


def test_scaled_objects_validate_against_kedas_crd(full: tuple[Manifest, ...]) -> None:
    validator = jsonschema.Draft4Validator(keda_schema("scaledobjects"))
    scaled = of_kind(full, "ScaledObject")
    assert {component(s) for s in scaled} == {
        "scheduler",
        "worker-llm",
        "worker-llm-13b",
        "worker-torch",
    }
    for manifest in scaled:
        errors = [
            f"{'.'.join(str(p) for p in error.path)}: {error.message}"
            for error in validator.iter_errors(manifest)
        ]
        assert not errors, (manifest["metadata"]["name"], errors)


def test_the_keda_check_refuses_a_misspelled_field(full: tuple[Manifest, ...]) -> None:
    validator = jsonschema.Draft4Validator(keda_schema("scaledobjects"))
    manifest = of_kind(full, "ScaledObject")[0]
    wrong = {**manifest, "spec": {**manifest["spec"], "minReplicas": 1}}
    assert not validator.is_valid(wrong)


# -- variables: settings the services read ---------------------------------------------------


def test_every_variable_is_a_setting_with_a_value_the_services_accept(
    rendered: tuple[Manifest, ...],
) -> None:
    for config_map in of_kind(rendered, "ConfigMap"):
        if component(config_map) in MONITORING_FILES:
            continue
        unknown = set(config_map["data"]) - KNOWN_VARIABLES
        assert not unknown, (config_map["metadata"]["name"], unknown)
    for secret in of_kind(rendered, "Secret"):
        assert set(secret["stringData"]) <= KNOWN_VARIABLES, secret["metadata"]["name"]
    for name, deployment in deployments_of(rendered).items():
        env = env_of(deployment, rendered)
        unknown = {key for key in env if key.startswith(ENV_PREFIX)} - KNOWN_VARIABLES
        assert not unknown, (name, unknown)
        settings = load_settings(env)  # raises ConfigError naming a bad value
        assert (settings.bus, settings.state, settings.health_host) == (
            "kafka",
            "redis",
            "0.0.0.0",
        ), name


@pytest.mark.parametrize(
    "override",
    [
        "config.SWITCHYARD_WORKER_TIMEOUT=3",  # SWITCHYARD_WORKER_TIMEOUT_S
        "scheduler.env.SWITCHYARD_LLM_POLCY=gaps",
        "workers.llm.env.SWITCHYARD_PROFILE=a100-80gb/llama-2-7b",
    ],
)
def test_an_unknown_variable_is_refused_by_name(override: str) -> None:
    done = template("--set", override)
    assert done.returncode != 0
    name = override.split("=")[0].rsplit(".", 1)[1]
    assert name in done.stderr, done.stderr


def test_the_values_schema_accepts_every_setting_the_chart_does_not_set_itself() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text(encoding="utf-8"))
    accepted = set(schema["$defs"]["switchyardEnv"]["properties"])
    assert accepted == (
        KNOWN_VARIABLES - CHART_OWNED - AUTH_OWNED - KAFKA_SECURITY - {WORKER_ID, HTTP_PORT}
    )
    deployments = deployments_of(render())
    for name, deployment in deployments.items():
        env = env_of(deployment, render())
        assert set(env) >= CHART_OWNED, (name, CHART_OWNED - set(env))
        assert (HTTP_PORT in env) == (name == "ingress"), name


# -- docker-compose.yml's services, command, images, settings --------------------------------


def test_every_compose_service_has_its_deployment(rendered: tuple[Manifest, ...]) -> None:
    compose = _compose_services()
    deployments = deployments_of(rendered)
    assert set(deployments) == set(compose)
    for name, spec in compose.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        container = main_container(deployments[name])
        assert container["args"] == spec["command"], name
        assert container["image"] == spec["image"], name  # switchyard:core or :ml
        waits = "registry" in (spec.get("depends_on") or {})
        inits = [c["name"] for c in pod.get("initContainers", [])]
        assert (inits == ["wait-for-registry"]) == waits, name
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        if waits:
            assert mounts["/var/lib/switchyard/registry"]["readOnly"], name
        else:
            assert not mounts, name


def test_compose_settings_carry_over_with_the_same_values() -> None:
    manifests = render()
    deployments = deployments_of(manifests)
    for name, spec in _compose_services().items():
        env = env_of(deployments[name], manifests)
        wanted = {
            k: str(v) for k, v in spec["environment"].items() if k not in ADDRESSES | COMPOSE_ONLY
        }
        assert {k: env.get(k) for k in wanted} == wanted, name


def test_the_registry_job_builds_what_the_readers_wait_for(
    rendered: tuple[Manifest, ...],
) -> None:
    (job,) = [j for j in of_kind(rendered, "Job") if component(j) == "registry"]
    compose_job = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))[
        "services"
    ]["registry"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == compose_job["command"]
    assert container["image"].endswith(":ml")
    claim = job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    for deployment in deployments_of(rendered).values():
        for volume in deployment["spec"]["template"]["spec"].get("volumes", []):
            assert volume["persistentVolumeClaim"]["claimName"] == claim


def test_the_load_generator_is_off_by_default_and_replays_against_the_ingress(
    full: tuple[Manifest, ...],
) -> None:
    assert not [j for j in of_kind(render(), "Job") if component(j) == "loadgen"]
    (job,) = [j for j in of_kind(full, "Job") if component(j) == "loadgen"]
    (service,) = [s for s in of_kind(full, "Service") if s["spec"].get("type") == "LoadBalancer"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    target = args[args.index("--target") + 1]
    assert target == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"


# -- probes, drain, disruption, ports ------------------------------------------------------------


def test_each_deployment_has_probes_resources_a_budget_and_a_metrics_service(
    rendered: tuple[Manifest, ...],
) -> None:
    budgets = {component(p) for p in of_kind(rendered, "PodDisruptionBudget")}
    metrics = {
        component(s): s
        for s in of_kind(rendered, "Service")
        if s["metadata"]["labels"].get("switchyard.io/metrics") == "true"
    }
    for name, deployment in deployments_of(rendered).items():
        container = main_container(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = env_of(deployment, rendered)
        assert ports["health"] == int(env["SWITCHYARD_HEALTH_PORT"]) == 8081, name
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            assert container[probe]["httpGet"] == {"path": path, "port": "health"}, name
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), (name, bound)
        assert name in budgets, name
        assert metrics[name]["spec"]["ports"][0]["targetPort"] == "health", name
        assert metrics[name]["spec"]["clusterIP"] == "None", name


def test_the_grace_period_outlasts_the_drain(rendered: tuple[Manifest, ...]) -> None:
    for name, deployment in deployments_of(rendered).items():
        spec = deployment["spec"]["template"]["spec"]
        drain_s = float(env_of(deployment, rendered)["SWITCHYARD_DRAIN_TIMEOUT_S"])
        pre_stop = main_container(deployment).get("lifecycle", {}).get("preStop")
        pre_stop_s = float(pre_stop["exec"]["command"][1]) if pre_stop else 0.0
        assert spec["terminationGracePeriodSeconds"] > drain_s + pre_stop_s, name


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("config.SWITCHYARD_DRAIN_TIMEOUT_S=40", "terminationGracePeriodSeconds"),
        ("predictor.replicas=2", "predictor"),
    ],
)
def test_settings_that_would_break_a_rollout_are_refused(override: str, message: str) -> None:
    done = template("--set", override)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_the_ingress_service_reaches_the_http_port(rendered: tuple[Manifest, ...]) -> None:
    ingress = deployments_of(rendered)["ingress"]
    container = main_container(ingress)
    (service,) = [
        s
        for s in of_kind(rendered, "Service")
        if component(s) == "ingress" and "switchyard.io/metrics" not in s["metadata"]["labels"]
    ]
    http = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert http == int(env_of(ingress, rendered)[HTTP_PORT]) == 8080
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http"}]
    labels = ingress["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())


# -- autoscaling -----------------------------------------------------------------------------


def test_the_ingress_scales_on_cpu_and_keda_is_off_by_default() -> None:
    defaults = render()
    (hpa,) = of_kind(defaults, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (
        hpa["spec"]["scaleTargetRef"]["name"]
        == deployments_of(defaults)["ingress"]["metadata"]["name"]
    )
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert not of_kind(defaults, "ScaledObject")  # a cluster without KEDA installs it


def test_autoscaled_deployments_leave_the_replica_count_to_their_autoscaler(
    rendered: tuple[Manifest, ...],
) -> None:
    targets = {s["spec"]["scaleTargetRef"]["name"] for s in of_kind(rendered, "ScaledObject")}
    targets |= {
        h["spec"]["scaleTargetRef"]["name"] for h in of_kind(rendered, "HorizontalPodAutoscaler")
    }
    for deployment in of_kind(rendered, "Deployment"):
        scaled = deployment["metadata"]["name"] in targets
        assert ("replicas" in deployment["spec"]) != scaled, deployment["metadata"]["name"]


def _consumed() -> dict[str, set[tuple[str, str]]]:
    """(consumer group, topic) pairs each service package subscribes with, from source."""
    pattern = re.compile(r"\.(?:subscribe|consume)\(\s*([A-Z_]+),\s*group=\"([^\"]+)\"")
    pairs: dict[str, set[tuple[str, str]]] = {}
    for path in (ROOT / "services").glob("*/**/*.py"):
        service = path.relative_to(ROOT / "services").parts[0]
        for constant, group in pattern.findall(path.read_text(encoding="utf-8")):
            topic: topics.Topic[Any] = getattr(topics, constant)
            pairs.setdefault(service, set()).add((group, topic.name))
    return pairs


def _kafka_triggers(scaled_object: Manifest) -> Iterator[Mapping[str, str]]:
    for trigger in scaled_object["spec"]["triggers"]:
        if trigger["type"] == "kafka":
            yield trigger["metadata"]


def test_lag_triggers_name_groups_and_topics_the_services_consume(
    full: tuple[Manifest, ...],
) -> None:
    consumed = _consumed()
    everywhere = set().union(*consumed.values())
    prefix = ALL_OPTIONS["config"]["SWITCHYARD_TOPIC_PREFIX"]
    requests_topics = {
        topics.REQUESTS.name,
        topics.CLASSIFICATION_REQUESTS.name,
        topics.STAGE_REQUESTS.name,
    }
    for scaled in of_kind(full, "ScaledObject"):
        name = component(scaled)
        pairs = set()
        for metadata in _kafka_triggers(scaled):
            assert metadata["bootstrapServers"] == "switchyard-kafka-bootstrap:9092"
            group, topic = metadata["consumerGroup"], metadata["topic"]
            assert group.startswith(prefix), (name, metadata)
            assert topic.startswith(prefix), (name, metadata)
            pairs.add((group.removeprefix(prefix), topic.removeprefix(prefix)))
            # A pool follows a group not its own: its partitions must not cap the pool.
            assert metadata["allowIdleConsumers"] == str(name != "scheduler").lower(), name
        assert pairs, name
        if name == "scheduler":
            assert pairs <= consumed["scheduler"]
            assert {topic for _, topic in pairs} == requests_topics
        else:
            assert pairs <= everywhere, (name, pairs - everywhere)


# -- API keys --------------------------------------------------------------------------------


def test_the_ingress_alone_needs_api_keys_kept_in_a_secret() -> None:
    manifests = render()
    deployments = deployments_of(manifests)
    env = env_of(deployments["ingress"], manifests)
    assert env["SWITCHYARD_AUTH"] == "api-key"
    assert env["SWITCHYARD_API_KEYS"] == f"test={TENANT_KEY_HASH}"
    for name, deployment in deployments.items():
        if name != "ingress":
            assert "SWITCHYARD_AUTH" not in env_of(deployment, manifests), name
    config_maps = [m["data"] for m in of_kind(manifests, "ConfigMap")]
    assert not any("SWITCHYARD_API_KEYS" in data for data in config_maps)


def test_keys_on_without_a_tenant_refuse_to_render_and_keys_off_render_none() -> None:
    refused = template(tenants=False)
    assert refused.returncode != 0
    assert "auth.apiKeys is empty" in refused.stderr
    off = render("--set", "auth.enabled=false")
    ingress_env = env_of(deployments_of(off)["ingress"], off)
    assert "SWITCHYARD_AUTH" not in ingress_env
    assert not [s for s in of_kind(off, "Secret") if s["metadata"]["name"].endswith("api-keys")]
    own = render("--set", "auth.existingSecret=tenants", "--set", "auth.existingSecretKey=keys")
    (item,) = [
        e
        for e in main_container(deployments_of(own)["ingress"])["env"]
        if e["name"] == "SWITCHYARD_API_KEYS"
    ]
    assert item["valueFrom"]["secretKeyRef"] == {"name": "tenants", "key": "keys"}


def test_a_raw_key_instead_of_its_hash_is_refused_by_the_schema() -> None:
    done = template("--set-json", 'auth.apiKeys=["test=sy-the-raw-key"]', tenants=False)
    assert done.returncode != 0
    assert "apiKeys" in done.stderr


def test_the_load_generator_sends_a_key_from_a_secret(full: tuple[Manifest, ...]) -> None:
    (job,) = [j for j in of_kind(full, "Job") if component(j) == "loadgen"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (item,) = container["env"]
    assert item["valueFrom"]["secretKeyRef"] == {"name": "loadgen-key", "key": "SWITCHYARD_API_KEY"}
    refused = template("--set", "loadgen.enabled=true")
    assert refused.returncode != 0
    assert "loadgen.apiKeySecret is empty" in refused.stderr


SASL_SSL = [
    "--set", "kafka.securityProtocol=SASL_SSL",
    "--set", "kafka.sasl.username=switchyard",
    "--set", "kafka.sasl.password=not-in-any-configmap",
    "--set", "kafka.tls.caSecret=switchyard-cluster-ca-cert",
]  # fmt: skip


def test_kafka_over_sasl_ssl_takes_its_password_from_a_secret_and_its_ca_from_a_mount() -> None:
    manifests = render(*SASL_SSL)
    config_maps = [m["data"] for m in of_kind(manifests, "ConfigMap")]
    assert not any("not-in-any-configmap" in str(data) for data in config_maps)
    for name, deployment in deployments_of(manifests).items():
        env = env_of(deployment, manifests)
        assert env["SWITCHYARD_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert env["SWITCHYARD_KAFKA_SASL_USERNAME"] == "switchyard", name
        assert env["SWITCHYARD_KAFKA_SASL_PASSWORD"] == "not-in-any-configmap", name
        assert env["SWITCHYARD_KAFKA_SSL_CAFILE"] == "/etc/switchyard/kafka-ca/ca.crt", name
        pod = deployment["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "kafka-ca"]
        assert volume["secret"]["secretName"] == "switchyard-cluster-ca-cert"
        mounts = {m["name"]: m for m in main_container(deployment)["volumeMounts"]}
        assert mounts["kafka-ca"]["mountPath"] == "/etc/switchyard/kafka-ca"
        assert mounts["kafka-ca"]["readOnly"] is True
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "Secret"):
            kubernetes_validate.validate(manifest, KUBE_VERSIONS[-1], strict=True)
    # The services accept what the chart gave them (the CA file is only in the pod).
    env = env_of(deployments_of(manifests)["scheduler"], manifests)
    env.pop("SWITCHYARD_KAFKA_SSL_CAFILE")
    assert load_settings(env).kafka_security_protocol == "SASL_SSL"


def test_sasl_without_a_user_or_password_refuses_to_render() -> None:
    no_user = template("--set", "kafka.securityProtocol=SASL_SSL")
    assert no_user.returncode != 0
    assert "set kafka.sasl.username" in no_user.stderr
    no_password = template(
        "--set", "kafka.securityProtocol=SASL_SSL", "--set", "kafka.sasl.username=u"
    )
    assert no_password.returncode != 0
    assert "kafka.sasl.password is empty" in no_password.stderr


def test_the_dashboard_and_the_alert_rules_ship_as_config_maps_unless_turned_off() -> None:
    files = CHART / "files"
    by_component = {component(m): m for m in of_kind(render(), "ConfigMap")}
    dashboard = by_component["dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # Grafana's sidecar
    assert json.loads(dashboard["data"]["switchyard.json"]) == json.loads(
        (files / "dashboard.json").read_text()
    )
    rules = by_component["alert-rules"]
    assert yaml.safe_load(rules["data"]["alerts.yml"]) == yaml.safe_load(
        (files / "alerts.yml").read_text()
    )
    off = render(
        "--set",
        "monitoring.dashboard.enabled=false",
        "--set",
        "monitoring.alertRules.enabled=false",
    )
    assert MONITORING_FILES.isdisjoint(component(m) for m in of_kind(off, "ConfigMap"))
