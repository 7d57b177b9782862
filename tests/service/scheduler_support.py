"""What the scheduler service tests share: scheduler replicas over the in-memory bus and
state store (a :class:`Stack` of any policy, or the ``jsq`` fixture), with workers
recorded as the monitor records them.

Requests are accepted in the ledger and published as the ingress does; every assignment
is read where workers read it: on the partition of ``switchyard.worker-inbox`` its
worker names in its heartbeats.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from switchyard.bus import Bus, MemoryBroker, Subscription
from switchyard.contracts.messages import (
    Assignment,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    Migration,
    PlacementOrder,
    WorkerDown,
)
from switchyard.contracts.topics import WORKER_EVENTS, WORKER_INBOX, requests_topic
from switchyard.lifecycle import RequestLedger, RequestRecord
from switchyard.policies.registry import make_llm_policy
from switchyard.selection.registry import make_window_scheduler
from switchyard.serving.catalogue import DEFAULT_LLM_APPLICATIONS, ServingCatalogue
from switchyard.state import keys
from switchyard.state.memory import MemoryStateStore

from services.scheduler import SchedulerService
from tests.support.services import heartbeat, memory_context, service_settings, store_worker

DownReason = Literal["heartbeat-timeout", "draining", "drained", "failed", "unclaimed"]

CATALOGUE = ServingCatalogue(
    llm={app.name: app for app in DEFAULT_LLM_APPLICATIONS}, classification={}
)
INBOX_READ = range(16)
"""The inbox partitions the tests read (every worker here names one of them)."""


def llm_request(request_id: str, prompt_tokens: int = 100) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="llama-2-7b",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=prompt_tokens, max_output_tokens=50),
        arrival_s=time.time(),
        reply_to="ingress-0",
        reply_partition=0,
    )


class Stack:
    """Scheduler replicas on one in-memory broker and state store, a client publishing
    requests as the ingress does, and a reader of the workers' inbox partitions."""

    def __init__(self, policy: str, spans: InMemorySpanExporter | None = None, **settings: object):
        self.broker = MemoryBroker()
        self.state = MemoryStateStore()
        self.policy = policy
        self.spans = spans
        self.settings = settings
        self.partitions: dict[str, int] = {}
        self.services: list[SchedulerService] = []
        self._client: Bus | None = None
        self._inbox: Subscription[Assignment | Migration | PlacementOrder] | None = None

    # -- workers, as the monitor records them -------------------------------------------

    def beat(self, worker_id: str, **fields: Any) -> Heartbeat:
        """``worker_id``'s heartbeat, naming the inbox partition it reads."""
        partition = self.partitions.setdefault(worker_id, len(self.partitions))
        assert partition in INBOX_READ
        made = heartbeat(worker_id, **fields)
        return made.model_copy(update={"inbox_partition": partition})

    async def worker(self, worker_id: str, *, status: str = "alive", **fields: Any) -> None:
        await store_worker(self.state, self.beat(worker_id, **fields), status=status)

    # -- the scheduler ---------------------------------------------------------------------

    @property
    def service(self) -> SchedulerService:
        return self.services[0]

    @property
    def client(self) -> Bus:
        assert self._client is not None, "start the stack first"
        return self._client

    @property
    def ledger(self) -> RequestLedger:
        return RequestLedger(self.state)

    async def start(self) -> SchedulerService:
        """Start a scheduler replica (the first also opens the client and the reader)."""
        settings = service_settings(
            llm_policy=self.policy,
            instance_id=f"scheduler-{len(self.services)}",
            **self.settings,
        )
        if self._client is None:
            client = await memory_context(
                "client", settings, self.broker, self.state, spans=self.spans
            )
            self._client = client.bus
            # Opened before anything is published: a reader starts at the partitions' end.
            self._inbox = self._client.subscribe(
                WORKER_INBOX, group="test-workers", partitions=list(INBOX_READ)
            )
            await self._inbox.open()
        ctx = await memory_context("scheduler", settings, self.broker, self.state, spans=self.spans)
        service = SchedulerService(
            ctx, CATALOGUE, make_llm_policy(self.policy), make_window_scheduler("lo-edf")
        )
        await service.start()
        self.services.append(service)
        return service

    async def stop(self) -> None:
        for service in self.services:
            if not service.ctx.stopping.is_set():
                service.ctx.stopping.set()
                await asyncio.wait_for(service.drain(), 10)
        if self._inbox is not None:
            await self._inbox.close()

    def metrics(self, service: SchedulerService | None = None) -> str:
        prometheus = (service or self.service).ctx.telemetry.prometheus
        assert prometheus is not None
        return prometheus.render()

    # -- requests and what the workers get -------------------------------------------------

    async def submit(self, request: InferenceRequest) -> None:
        """What the ingress does: record the request as queued, then publish it."""
        assert (await self.ledger.accept(request)).accepted
        await self.publish(request)

    async def publish(self, request: InferenceRequest) -> None:
        await self.client.publish(requests_topic(request), request)

    async def worker_down(
        self,
        worker_id: str,
        orphans: list[str],
        *,
        reason: DownReason = "heartbeat-timeout",
        held: list[str] | None = None,
    ) -> None:
        """Publish the monitor's verdict that ``worker_id`` is gone (or going), listing
        ``orphans`` and, for a drain, what it ``held`` waiting."""
        await self.client.publish(WORKER_EVENTS, worker_down(worker_id, orphans, reason, held))

    async def assignments(self, count: int) -> list[Assignment]:
        """The next ``count`` assignments sent to the workers, each checked to have gone
        to the partition its worker names."""
        assert self._inbox is not None
        got: list[Assignment] = []
        while len(got) < count:
            delivery = await self._inbox.next_within(10.0)
            assert delivery is not None, f"only {len(got)} of {count} assignments came"
            message = delivery.message
            assert isinstance(message, Assignment), message
            assert delivery.envelope.partition == self.partitions[message.worker_id], message
            got.append(message)
        return got

    async def assignments_until(self, message_id: str) -> list[Assignment]:
        """The assignments sent to the workers up to the one with ``message_id``."""
        got: list[Assignment] = []
        while not got or got[-1].message_id != message_id:
            got += await self.assignments(1)
        return got

    async def sent_meanwhile(self) -> list[Assignment | Migration | PlacementOrder]:
        """What was sent to the workers and not read yet (everything awaited so far has
        reached the broker)."""
        assert self._inbox is not None
        return [d.message for d in await self._inbox.next_batch(100, timeout_s=0.2)]

    async def record(self, request_id: str) -> RequestRecord:
        found = await self.ledger.read(request_id)
        assert found is not None, f"no record of {request_id}"
        return found

    async def assigned_to(self, worker_id: str, request_id: str) -> bool:
        """Whether ``worker_id``'s assigned set names the request."""
        return await self.state.zscore(keys.assigned(worker_id), request_id) is not None


def worker_down(
    worker_id: str, orphans: list[str], reason: DownReason, held: list[str] | None
) -> WorkerDown:
    return WorkerDown(
        worker_id=worker_id,
        reason=reason,
        detected_at_s=time.time(),
        orphaned_request_ids=orphans,
        held_request_ids=held,
    )


@pytest.fixture(name="jsq")
async def jsq_fixture() -> AsyncIterator[Stack]:
    stack = Stack("jsq")
    yield stack
    await stack.stop()
