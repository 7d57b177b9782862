"""Tenants: API keys, the tenant a call acts for, and request ids scoped to it.

With ``SWITCHYARD_AUTH=api-key`` every call under ``/v1/`` carries ``Authorization:
Bearer KEY``. Only the SHA-256 of each key is configured (``SWITCHYARD_API_KEYS_FILE`` or
``SWITCHYARD_API_KEYS``), never the key, so the configuration and the process hold
nothing a client could replay; a call without a known key gets 401 before its body is
read. Keys are random 256-bit tokens (``switchyard keys new``), so one unsalted hash is
as strong as the key itself.

A tenant's request ids are its own: the id a client chooses, or the one the server
makes, is recorded as ``{tenant}~{id}`` (:meth:`Tenant.scoped`), so two tenants may
use the same id and neither reads, conflicts with, or gets the answer of the other's
request; answers show the client's id alone (:func:`public_request_id`; ``~`` is not
allowed in a client's id). With auth off there is one anonymous tenant and ids are
recorded as given.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from switchyard.config import Settings
from switchyard.errors import ConfigError

SCOPE_SEPARATOR = "~"
"""Between a tenant's name and a request id in the recorded id."""

KEY_PREFIX = "sy-"
TENANT_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

TenantName = Annotated[str, Field(pattern=TENANT_NAME_PATTERN)]
KeyHash = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may use; 0 is no limit."""

    requests_per_s: float = 0.0
    burst: int = 0
    """Calls above the rate taken at once; 0: one second's worth (at least 1)."""
    max_concurrent: int = 0

    @property
    def limited(self) -> bool:
        return self.requests_per_s > 0 or self.max_concurrent > 0

    @property
    def bucket_size(self) -> int:
        return self.burst or max(1, int(-(-self.requests_per_s // 1)))


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a call acts for. ``name`` None: the anonymous tenant of an API without keys."""

    name: str | None
    limits: TenantLimits = field(default_factory=TenantLimits)

    def scoped(self, request_id: str) -> str:
        """The recorded id of this tenant's ``request_id``."""
        return request_id if self.name is None else f"{self.name}{SCOPE_SEPARATOR}{request_id}"


ANONYMOUS = Tenant(None)


def public_request_id(request_id: str) -> str:
    """The id a client knows a recorded request by (its tenant's name dropped)."""
    _, separator, public = request_id.partition(SCOPE_SEPARATOR)
    return public if separator else request_id


def hash_key(key: str) -> str:
    """The SHA-256 (hex) of an API key: what the configuration holds."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A new API key: ``sy-`` and 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class _TenantEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TenantName
    key_sha256: list[KeyHash] = Field(min_length=1)
    requests_per_s: float = Field(default=0.0, ge=0)
    burst: int = Field(default=0, ge=0)
    max_concurrent: int = Field(default=0, ge=0)


class _KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: list[_TenantEntry]


class KeyRing:
    """The tenants, by the hash of each of their keys."""

    def __init__(self, by_hash: Mapping[str, Tenant]) -> None:
        self._by_hash = dict(by_hash)

    def tenant_for(self, key: str) -> Tenant | None:
        """The tenant ``key`` belongs to; None for an unknown key."""
        return self._by_hash.get(hash_key(key))

    @property
    def tenants(self) -> list[str]:
        return sorted({t.name for t in self._by_hash.values() if t.name is not None})

    @classmethod
    def from_entries(cls, entries: Iterable[tuple[str, str, TenantLimits]]) -> KeyRing:
        """From ``(tenant, key hash, limits)``; a hash given to two tenants is an error."""
        by_hash: dict[str, Tenant] = {}
        tenants: dict[str, Tenant] = {}
        for name, key_hash, limits in entries:
            tenant = tenants.setdefault(name, Tenant(name, limits))
            if by_hash.get(key_hash, tenant) != tenant:
                raise ConfigError(f"API key hash {key_hash[:12]}... is given to two tenants")
            by_hash[key_hash] = tenant
        return cls(by_hash)


def load_key_ring(settings: Settings) -> KeyRing | None:
    """The tenants the settings name; None with ``auth`` off. Raises ConfigError naming
    the problem (an unreadable file, a bad entry, no tenant at all)."""
    if settings.auth == "off":
        return None
    defaults = TenantLimits(
        requests_per_s=settings.tenant_requests_per_s,
        burst=settings.tenant_burst,
        max_concurrent=settings.tenant_max_concurrent,
    )
    entries: list[tuple[str, str, TenantLimits]] = []
    if settings.api_keys_file:
        entries.extend(_file_entries(Path(settings.api_keys_file)))
    if settings.api_keys:
        entries.extend(_env_entries(settings.api_keys, defaults))
    if not entries:
        raise ConfigError(
            "SWITCHYARD_AUTH=api-key needs tenants: set SWITCHYARD_API_KEYS_FILE or "
            "SWITCHYARD_API_KEYS (`switchyard keys new TENANT` makes a key)"
        )
    return KeyRing.from_entries(entries)


def _file_entries(path: Path) -> list[tuple[str, str, TenantLimits]]:
    try:
        document = _KeyFile.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise ConfigError(f"SWITCHYARD_API_KEYS_FILE {path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"SWITCHYARD_API_KEYS_FILE {path}: not JSON ({exc})") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"SWITCHYARD_API_KEYS_FILE {path}: {problems}") from None
    return [
        (
            entry.name,
            key_hash,
            TenantLimits(entry.requests_per_s, entry.burst, entry.max_concurrent),
        )
        for entry in document.tenants
        for key_hash in entry.key_sha256
    ]


def _env_entries(spec: str, limits: TenantLimits) -> list[tuple[str, str, TenantLimits]]:
    entries = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, key_hash = item.partition("=")
        if not re.match(TENANT_NAME_PATTERN, name):
            raise ConfigError(
                f"SWITCHYARD_API_KEYS: tenant {name!r} must be 1 to 32 lower-case letters, "
                "digits or '-'"
            )
        if not _SHA256_HEX.match(key_hash):
            raise ConfigError(
                f"SWITCHYARD_API_KEYS: tenant {name!r} needs the SHA-256 of its key (64 hex "
                "digits), never the key itself"
            )
        entries.append((name, key_hash, limits))
    return entries


def key_file_entry(tenant: str, key: str, limits: TenantLimits) -> dict[str, object]:
    """The key file's entry of a tenant with one key (the key's hash, never the key)."""
    if not re.match(TENANT_NAME_PATTERN, tenant):
        raise ConfigError(f"tenant {tenant!r} must be 1 to 32 lower-case letters, digits or '-'")
    entry: dict[str, object] = {"name": tenant, "key_sha256": [hash_key(key)]}
    if limits.requests_per_s:
        entry["requests_per_s"] = limits.requests_per_s
    if limits.burst:
        entry["burst"] = limits.burst
    if limits.max_concurrent:
        entry["max_concurrent"] = limits.max_concurrent
    return entry
