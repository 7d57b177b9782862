"""Which service replicas run: each says so in the state store while it runs.

A running replica keeps ``service:{name}:{instance}`` (a hash: its name, instance,
state, health URL, when it started and last said so) and its member of the ``services``
sorted set, scored by when it last said so, every :data:`PRESENCE_PERIOD_S`. The hash
lives :data:`PRESENCE_TTL_S`, so a replica that died without a word drops out of
``switchyard status`` on its own; one that stops cleanly says ``draining``, then removes
both. Workers and ingress replicas are also visible through their own records (the
monitor's worker hashes, the answers topic's leases); this covers every service alike.

Presence is advisory: a failed write is logged and retried at the next period, never a
reason for a service to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from switchyard.state import keys
from switchyard.state.base import StateStore

log = logging.getLogger(__name__)

PRESENCE_PERIOD_S = 5.0
"""How often a running replica renews its presence."""

PRESENCE_TTL_S = 3 * PRESENCE_PERIOD_S
"""How long a replica's hash outlives its last renewal."""

WRITE_TIMEOUT_S = 1.0
"""The longest a presence write may take: a stop never waits on an unreachable store."""

FORGET_AFTER_S = 600.0
"""Members of ``services`` silent this long are removed by the next renewal of any replica
(their hashes expired long before)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceReplica:
    """One replica as it last described itself."""

    name: str
    instance: str
    state: str
    """``starting``, ``ready`` or ``draining``."""
    health_url: str
    started_s: float
    last_seen_s: float


class Presence:
    """Keeps one replica's presence (see the module docstring).

    Args:
        state: the store.
        name: the service's name (``ingress``, ``worker``, ...).
        instance: the replica's instance id.
        health_url: returns the replica's health URL (known once its server is bound).
        clock: wall seconds.
    """

    def __init__(
        self,
        state: StateStore,
        name: str,
        instance: str,
        health_url: Callable[[], str],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.member = f"{name}:{instance}"
        self.name = name
        self.instance = instance
        self._health_url = health_url
        self._clock = clock
        self._started_s = clock()
        self._state = "starting"

    async def say(self, state: str | None = None) -> None:
        """Write the presence now (with ``state`` when given); failures are logged."""
        if state is not None:
            self._state = state
        try:
            await asyncio.wait_for(self._write(), WRITE_TIMEOUT_S)
        except Exception as exc:
            log.debug("presence of %s not written: %s", self.member, exc)

    async def _write(self) -> None:
        now_s = self._clock()
        key = keys.service(self.member)
        await self.state.hset(
            key,
            {
                "name": self.name,
                "instance": self.instance,
                "state": self._state,
                "health_url": self._health_url(),
                "started_s": repr(self._started_s),
                "last_seen_s": repr(now_s),
            },
        )
        await self.state.expire(key, PRESENCE_TTL_S)
        await self.state.zadd(keys.SERVICES, {self.member: now_s})
        gone = await self.state.zrange_by_score(keys.SERVICES, -math.inf, now_s - FORGET_AFTER_S)
        if gone:
            await self.state.zrem(keys.SERVICES, *(member for member, _ in gone))

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """Say ``ready``, renew every :data:`PRESENCE_PERIOD_S` while the block runs,
        say ``draining`` when it leaves."""
        await self.say("ready")
        leaving = asyncio.Event()
        renewing = asyncio.create_task(self._renew(leaving))
        try:
            yield
        finally:
            leaving.set()
            await asyncio.gather(renewing, return_exceptions=True)
            await self.say("draining")

    async def _renew(self, leaving: asyncio.Event) -> None:
        while not leaving.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(leaving.wait(), PRESENCE_PERIOD_S)
            if not leaving.is_set():
                await self.say()

    async def withdraw(self) -> None:
        """Remove the presence (a clean stop); failures are logged."""
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await self.state.zrem(keys.SERVICES, self.member)
                await self.state.delete(keys.service(self.member))
        except Exception as exc:
            log.debug("presence of %s not removed: %s", self.member, exc)


async def read_replicas(state: StateStore, now_s: float) -> list[ServiceReplica]:
    """The replicas whose presence has not expired, by name then instance."""
    members = await state.zrange_by_score(keys.SERVICES, now_s - PRESENCE_TTL_S, math.inf)
    replicas: list[ServiceReplica] = []
    for member, _ in members:
        fields = await state.hgetall(keys.service(member))
        if not fields:
            continue
        try:
            replicas.append(
                ServiceReplica(
                    name=fields["name"],
                    instance=fields["instance"],
                    state=fields.get("state", ""),
                    health_url=fields.get("health_url", ""),
                    started_s=float(fields["started_s"]),
                    last_seen_s=float(fields["last_seen_s"]),
                )
            )
        except (KeyError, ValueError):
            log.debug("unreadable presence of %s: %s", member, fields)
    return sorted(replicas, key=lambda r: (r.name, r.instance))
