"""Leases on the partitions of an addressed topic: one reader per partition.

An addressed topic (a worker's inbox, an ingress replica's answers) is read partition by
partition: each destination leases a partition of its own, names it to its senders (a
worker in its heartbeats, an ingress replica in each request's ``reply_partition``), and
reads only that partition, so nobody decodes messages meant for someone else.

A lease is the key ``lease:{topic}:{partition}`` holding the owner's id, with a time to
live that the owner renews (:meth:`PartitionLease.renew`, every third of it). A
destination that is gone (killed, scaled away) frees its partition when the lease runs
out; one that stops cleanly releases it at once. A new owner starts reading at the
partition's end, so what was sent to the previous owner is never read again (a worker's
unfinished work is re-assigned by the monitor's WorkerDown; an ingress replica's
unanswered calls died with it, and their answers are in the request records).

When every partition is leased (more destinations than partitions), a destination
shares the partition its id hashes to: it still reads only records keyed with its own
id, skipping the others' undecoded. ``SWITCHYARD_ADDRESSED_PARTITIONS`` sets how many
destinations get one of their own.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.state import keys
from switchyard.state.base import Script, ScriptView, StateStore

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 30.0
"""How long a lease outlives its owner's last renewal: far longer than the worker
timeout, so a worker's partition is never handed to another before the worker was
declared dead and its work re-assigned."""


def _release(view: ScriptView, keys_: Sequence[str], args: Sequence[str]) -> list[str]:
    if view.get(keys_[0]) != args[0]:
        return ["0"]
    return [str(view.delete(keys_[0]))]


_RELEASE = Script(
    "release-lease",
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'0'} end
return {tostring(redis.call('DEL', KEYS[1]))}
""",
    _release,
)
"""Delete a lease only while it is the caller's (one atomic step)."""


@dataclass(frozen=True, slots=True)
class Leased:
    """The partition a destination reads, and whether it has it alone."""

    partition: int
    exclusive: bool


class PartitionLease:
    """One owner's lease on a partition of one addressed topic.

    Args:
        state: where leases are kept.
        topic: the addressed topic's name on the broker (with the deployment's prefix).
        partitions: how many partitions it has.
        owner: the destination's id (worker id, ingress instance id).
        ttl_s: the lease's time to live; renew at least every third of it.
    """

    def __init__(
        self,
        state: StateStore,
        topic: str,
        partitions: int,
        owner: str,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        self.state = state
        self.topic = topic
        self.partitions = partitions
        self.owner = owner
        self.ttl_s = ttl_s
        self.held: Leased | None = None

    @property
    def renew_every_s(self) -> float:
        """How often :meth:`renew` should run."""
        return self.ttl_s / 3.0

    def _preferred(self) -> int:
        # Stable across restarts: an owner restarted under the same id tries its old
        # partition first, where its group's committed offset is.
        return zlib.crc32(self.owner.encode()) % self.partitions

    async def acquire(self) -> Leased:
        """Lease a free partition (the owner's preferred one first; one it already holds
        is kept), or share the preferred one when none is free."""
        order = [(self._preferred() + i) % self.partitions for i in range(self.partitions)]
        holders = await self.state.get_many([keys.lease(self.topic, p) for p in order])
        for partition, holder in zip(order, holders, strict=True):
            key = keys.lease(self.topic, partition)
            if holder == self.owner:
                if await self.state.compare_and_set(key, self.owner, self.owner, ttl_s=self.ttl_s):
                    self.held = Leased(partition, exclusive=True)
                    return self.held
            elif holder is None and await self.state.set_if_absent(
                key, self.owner, ttl_s=self.ttl_s
            ):
                self.held = Leased(partition, exclusive=True)
                return self.held
        log.warning(
            "all %d partitions of %s are leased: %s shares partition %d (raise "
            "SWITCHYARD_ADDRESSED_PARTITIONS to give every destination its own)",
            self.partitions,
            self.topic,
            self.owner,
            self._preferred(),
        )
        self.held = Leased(self._preferred(), exclusive=False)
        return self.held

    async def renew(self) -> bool:
        """Extend the lease; False when it was lost (it ran out and another owner took
        the partition): the owner must then :meth:`acquire` again and read there."""
        held = self.held
        if held is None or not held.exclusive:
            return True
        key = keys.lease(self.topic, held.partition)
        if await self.state.compare_and_set(key, self.owner, self.owner, ttl_s=self.ttl_s):
            return True
        # Not ours any more, or gone: take it again only if nobody else has.
        return await self.state.set_if_absent(key, self.owner, ttl_s=self.ttl_s)

    async def release(self) -> None:
        """Give the partition up (a clean stop), so a new destination can lease it now."""
        held, self.held = self.held, None
        if held is not None and held.exclusive:
            key = keys.lease(self.topic, held.partition)
            await self.state.run_script(_RELEASE, [key], [self.owner])
