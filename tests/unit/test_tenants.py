"""API keys and tenants as configured: hashed keys from a file or the environment, every
mistake a ConfigError that names it, and request ids scoped by tenant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from switchyard.config import load_settings
from switchyard.errors import ConfigError

from cli.main import main
from services.ingress.tenants import (
    ANONYMOUS,
    Tenant,
    hash_key,
    load_key_ring,
    new_key,
    public_request_id,
)


def write_keys(tmp_path: Path, document: object) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_auth_off_has_no_key_ring() -> None:
    assert load_key_ring(load_settings({})) is None


def test_a_key_file_names_tenants_by_the_hash_of_their_keys(tmp_path: Path) -> None:
    key = new_key()
    path = write_keys(
        tmp_path,
        {
            "tenants": [
                {"name": "acme", "key_sha256": [hash_key(key)], "requests_per_s": 5, "burst": 10}
            ]
        },
    )
    ring = load_key_ring(load_settings({}, auth="api-key", api_keys_file=path))
    assert ring is not None
    tenant = ring.tenant_for(key)
    assert tenant is not None
    assert tenant.name == "acme"
    assert tenant.limits.requests_per_s == 5
    assert tenant.limits.bucket_size == 10
    assert ring.tenant_for(key + "x") is None
    assert key not in Path(path).read_text()


def test_keys_from_the_environment_take_the_default_limits() -> None:
    key = new_key()
    settings = load_settings(
        {"SWITCHYARD_AUTH": "api-key", "SWITCHYARD_API_KEYS": f"beta={hash_key(key)}"},
        tenant_max_concurrent=4,
    )
    ring = load_key_ring(settings)
    assert ring is not None
    tenant = ring.tenant_for(key)
    assert tenant is not None
    assert tenant.limits.max_concurrent == 4


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"auth": "api-key"}, "SWITCHYARD_API_KEYS_FILE or SWITCHYARD_API_KEYS"),
        ({"auth": "api-key", "api_keys": "acme=sy-the-raw-key"}, "never the key itself"),
        ({"auth": "api-key", "api_keys": f"Acme={'0' * 64}"}, "'Acme'"),
        ({"auth": "api-key", "api_keys_file": "/nonexistent/keys.json"}, "cannot read"),
    ],
)
def test_every_configuration_mistake_is_named(settings: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace("(", r"\(")):
        load_key_ring(load_settings({}, **settings))


def test_a_bad_key_file_entry_is_named(tmp_path: Path) -> None:
    path = write_keys(tmp_path, {"tenants": [{"name": "acme", "key_sha256": ["abc"]}]})
    with pytest.raises(ConfigError, match=r"tenants\.0\.key_sha256\.0"):
        load_key_ring(load_settings({}, auth="api-key", api_keys_file=path))
    twice = write_keys(
        tmp_path,
        {
            "tenants": [
                {"name": "one", "key_sha256": ["a" * 64]},
                {"name": "two", "key_sha256": ["a" * 64]},
            ]
        },
    )
    with pytest.raises(ConfigError, match="two tenants"):
        load_key_ring(load_settings({}, auth="api-key", api_keys_file=twice))


def test_request_ids_are_scoped_by_tenant_and_shown_without_it() -> None:
    acme = Tenant("acme")
    assert acme.scoped("order/1") == "acme~order/1"
    assert public_request_id("acme~order/1") == "order/1"
    assert ANONYMOUS.scoped("order/1") == "order/1"
    assert public_request_id("order/1") == "order/1"


def test_keys_new_prints_the_key_once_and_only_its_hash_for_the_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["keys", "new", "acme", "--requests-per-s", "5"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    key = lines[1].strip()
    assert key.startswith("sy-")
    assert len(key) > 40
    entry = json.loads(lines[3])
    assert entry == {"name": "acme", "key_sha256": [hash_key(key)], "requests_per_s": 5.0}
    assert sum(key in line for line in lines) == 1
