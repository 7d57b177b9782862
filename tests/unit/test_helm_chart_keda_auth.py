"""The chart's KEDA lag autoscalers on a secured Kafka: each trigger names the SASL
mechanism and TLS the services use, and one TriggerAuthentication gives KEDA the same
user, password and CA the services read, from where they read them (no password in any
ScaledObject or TriggerAuthentication); both validate against KEDA's CRDs."""

from __future__ import annotations

import jsonschema  # type: ignore[import-untyped]

from tests.support.helm_chart import (
    Manifest,
    deployments_of,
    env_of,
    keda_schema,
    main_container,
    of_kind,
    render,
)

SASL_SSL = (
    "--set", "kafka.securityProtocol=SASL_SSL",
    "--set", "kafka.sasl.username=switchyard",
    "--set", "kafka.sasl.password=not-in-any-keda-resource",
    "--set", "kafka.tls.caSecret=switchyard-cluster-ca-cert",
    "--set", "scheduler.autoscaling.enabled=true",
    "--set", "workers.llm.autoscaling.enabled=true",
)  # fmt: skip


def _errors(validator: jsonschema.Draft4Validator, manifest: Manifest) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in error.path)}: {error.message}"
        for error in validator.iter_errors(manifest)
    ]


def test_lag_triggers_on_sasl_ssl_authenticate_as_the_services_do() -> None:
    manifests = render(*SASL_SSL)
    scaled = of_kind(manifests, "ScaledObject")
    (auth,) = of_kind(manifests, "TriggerAuthentication")
    assert scaled
    objects = jsonschema.Draft4Validator(keda_schema("scaledobjects"))
    for manifest in scaled:
        assert not _errors(objects, manifest), manifest["metadata"]["name"]
        for trigger in manifest["spec"]["triggers"]:
            assert trigger["metadata"]["sasl"] == "scram_sha512"
            assert trigger["metadata"]["tls"] == "enable"
            assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert not _errors(jsonschema.Draft4Validator(keda_schema("triggerauthentications")), auth)
    # The user as the services' environment has it; the password and the CA from the
    # Secrets the services' pods read them from.
    spec = auth["spec"]
    assert spec["env"] == [{"parameter": "username", "name": "SWITCHYARD_KAFKA_SASL_USERNAME"}]
    refs = {ref["parameter"]: (ref["name"], ref["key"]) for ref in spec["secretTargetRef"]}
    scheduler = deployments_of(manifests)["scheduler"]
    (password,) = [
        v for v in main_container(scheduler)["env"] if v["name"] == "SWITCHYARD_KAFKA_SASL_PASSWORD"
    ]
    from_secret = password["valueFrom"]["secretKeyRef"]
    assert refs["password"] == (from_secret["name"], from_secret["key"])
    assert refs["ca"] == ("switchyard-cluster-ca-cert", "ca.crt")
    assert env_of(scheduler, manifests)["SWITCHYARD_KAFKA_SASL_USERNAME"] == "switchyard"
    keda = [m for m in manifests if m["apiVersion"].startswith("keda.sh/")]
    assert "not-in-any-keda-resource" not in str(keda)


def test_tls_alone_needs_only_the_ca_and_plaintext_or_public_tls_no_authentication() -> None:
    with_ca = render(
        "--set", "kafka.securityProtocol=SSL",
        "--set", "kafka.tls.caSecret=brokers-ca",
        "--set", "scheduler.autoscaling.enabled=true",
    )  # fmt: skip
    (auth,) = of_kind(with_ca, "TriggerAuthentication")
    assert auth["spec"] == {
        "secretTargetRef": [{"parameter": "ca", "name": "brokers-ca", "key": "ca.crt"}]
    }
    for trigger in of_kind(with_ca, "ScaledObject")[0]["spec"]["triggers"]:
        assert trigger["metadata"]["tls"] == "enable"
        assert "sasl" not in trigger["metadata"]
    plain = render("--set", "scheduler.autoscaling.enabled=true")
    public_tls = render(
        "--set", "kafka.securityProtocol=SSL", "--set", "scheduler.autoscaling.enabled=true"
    )  # fmt: skip
    for manifests, wanted_tls in ((plain, None), (public_tls, "enable")):
        assert not of_kind(manifests, "TriggerAuthentication")
        for trigger in of_kind(manifests, "ScaledObject")[0]["spec"]["triggers"]:
            assert "authenticationRef" not in trigger
            assert "sasl" not in trigger["metadata"]
            assert trigger["metadata"].get("tls") == wanted_tls
