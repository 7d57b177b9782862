"""A destination's own partition of an addressed topic: leased, renewed, read.

Workers read their assignments and migrations from ``switchyard.worker-inbox``, ingress
replicas their answers from ``switchyard.answers``, each from a partition of its own
(:mod:`switchyard.state.leases` explains the leases). Senders learn the partition from
the destination itself: a worker names it in every heartbeat, an ingress replica in
every request it publishes (``reply_partition``). So a message is fetched and decoded by
the one reader it is for, however many workers and replicas there are.

Usage, in a service::

    inbox = Inbox(ctx, WORKER_INBOX, owner=worker_id)
    await inbox.open()                        # lease a partition (inbox.partition)
    self.spawn_routine("lease_routine", inbox.lease_routine)
    async with inbox.subscribe(group=f"worker-{worker_id}") as sub: ...
    await inbox.close()                       # give the partition back
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from switchyard.bus import Envelope, Subscription
from switchyard.contracts.base import Message
from switchyard.contracts.topics import Topic
from switchyard.errors import SwitchyardError
from switchyard.runtime.service import ServiceContext
from switchyard.state.leases import DEFAULT_LEASE_TTL_S, Leased, PartitionLease

M = TypeVar("M", bound=Message)

log = logging.getLogger(__name__)


class InboxLostError(SwitchyardError):
    """The lease on the inbox's partition ran out and another destination took it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class Inbox(Generic[M]):
    """One destination's partition of an addressed topic.

    Args:
        ctx: the service's context (its bus and state store).
        topic: the addressed topic.
        owner: the destination's id: the key of every message sent to it.
        ttl_s: the lease's time to live.
        on_lost: called when the lease was lost (before :meth:`lease_routine` raises), so
            the owner can stop relying on what was sent to the old partition.
    """

    def __init__(
        self,
        ctx: ServiceContext,
        topic: Topic[M],
        owner: str,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        if not topic.addressed:
            raise ValueError(f"{topic.name} is not an addressed topic")
        self.ctx = ctx
        self.topic: Topic[M] = topic
        self.owner = owner
        self._ttl_s = ttl_s
        self._on_lost = on_lost
        self._lease: PartitionLease | None = None
        self._owner_key = owner.encode()
        self.generation = 0
        """Grows each time the lease is re-acquired after a loss: a reading loop that sees
        it change re-subscribes (:meth:`check`)."""

    @property
    def leased(self) -> Leased:
        """The partition held (raises before :meth:`open`)."""
        if self._lease is None or self._lease.held is None:
            raise RuntimeError("the inbox is not open")
        return self._lease.held

    @property
    def partition(self) -> int:
        """The partition senders address this destination's messages to."""
        return self.leased.partition

    async def open(self) -> Leased:
        """Lease a partition (creating the topic first when it does not exist)."""
        bus = self.ctx.bus
        partitions = await bus.partitions_of(self.topic)
        self._lease = PartitionLease(
            self.ctx.state, bus.topic_name(self.topic), partitions, self.owner, ttl_s=self._ttl_s
        )
        leased = await self._lease.acquire()
        log.info(
            "%s reads %s partition %d%s",
            self.owner,
            self.topic.name,
            leased.partition,
            "" if leased.exclusive else " (shared: every partition is leased)",
        )
        return leased

    def check(self, generation: int) -> None:
        """Raise :class:`InboxLostError` (retriable: the routine restarts and subscribes
        anew) when the partition changed since ``generation``."""
        if generation != self.generation:
            raise InboxLostError(f"{self.owner} reads {self.topic.name} from a new partition")

    def mine(self, envelope: Envelope) -> bool:
        """Whether a record of the partition is for this destination (its key is the
        owner's id): a shared partition holds others' too, skipped undecoded."""
        return envelope.key == self._owner_key

    def subscribe(self, *, group: str, stopping: asyncio.Event | None = None) -> Subscription[M]:
        """A subscription to the leased partition, keeping this destination's records."""
        return self.ctx.bus.subscribe(
            self.topic,
            group=group,
            stopping=stopping if stopping is not None else self.ctx.stopping,
            record_filter=self.mine,
            partitions=[self.partition],
        )

    async def lease_routine(self) -> None:
        """Renew the lease until the service stops. A lease that was lost (the process
        was frozen past its time to live) is acquired again, maybe on another partition;
        :attr:`generation` grows so that the reading loop re-subscribes there."""
        lease = self._lease
        if lease is None:
            raise RuntimeError("the inbox is not open")
        stopping = self.ctx.stopping
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), lease.renew_every_s)
            if stopping.is_set():
                return
            if await lease.renew():
                continue
            lost = lease.held
            log.error(
                "%s lost its lease on %s partition %s: another destination reads it now",
                self.owner,
                self.topic.name,
                None if lost is None else lost.partition,
            )
            await lease.acquire()
            self.generation += 1
            if self._on_lost is not None:
                self._on_lost()

    async def close(self) -> None:
        """Give the partition back (best effort: an unreachable store lets it expire)."""
        if self._lease is not None:
            try:
                await self._lease.release()
            except Exception as exc:
                log.warning("could not release %s's partition lease: %s", self.owner, exc)
