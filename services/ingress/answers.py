"""The registry of HTTP calls waiting for their answers on this ingress replica.

Answers come back on the bus, on the partition of
:data:`~switchyard.contracts.topics.ANSWERS` this replica leased (every request names it
in ``reply_partition``), so a replica reads only its own answers and streamed chunks, in
order; :meth:`AnswerRegistry.deliver` hands them to the :class:`Waiter`\\ s registered
for the request id (:mod:`services.ingress.routing`).

Delivery is at least once, so the registry is idempotent:

- an answer for a request nobody waits for any more is dropped;
- a waiter resolves once: a duplicate completion is ignored;
- a chunk seen before (same epoch and index, a redelivery) is dropped;
- a completion from an older epoch than the newest chunk seen is ignored: the request
  was moved (re-assigned) and that completion is a stale copy of the old decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from switchyard.contracts.messages import Completion, OutputChunk

Answer = OutputChunk | Completion


class Waiter:
    """One HTTP call waiting for one request's answer.

    ``stream`` waiters get every new chunk and then the completion, in arrival order,
    from :meth:`next_event`; every waiter can await the completion alone with
    :meth:`completion`.
    """

    def __init__(self, request_id: str, *, stream: bool) -> None:
        self.request_id = request_id
        self.stream = stream
        self.registered_s = time.monotonic()
        self._completion: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._events: asyncio.Queue[Answer] = asyncio.Queue()
        self._seen: set[tuple[int, int]] = set()
        self._epoch = 0

    @property
    def done(self) -> bool:
        """Whether the completion arrived."""
        return self._completion.done()

    async def completion(self, timeout_s: float) -> Completion | None:
        """The completion, or None when none came within ``timeout_s``."""
        if self._completion.done():
            return self._completion.result()
        # asyncio.timeout, not wait_for: no task per call (wait_for makes one), and the
        # shield keeps the completion for a later call when this one times out.
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                return await asyncio.shield(self._completion)
        except TimeoutError:
            return None

    async def completion_unless(
        self, gone: asyncio.Future[None], timeout_s: float
    ) -> Completion | None:
        """:meth:`completion`, or None as soon as ``gone`` is done (the client left)."""
        if self._completion.done():
            return self._completion.result()
        # Futures, not coroutines: asyncio.wait makes no task for them, nor cancels them.
        done, _ = await asyncio.wait(
            (self._completion, gone), timeout=max(timeout_s, 0.0), return_when="FIRST_COMPLETED"
        )
        return self._completion.result() if self._completion in done else None

    async def next_event(self, timeout_s: float) -> Answer | None:
        """The next chunk or the completion (streaming waiters), or None on timeout."""
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                return await self._events.get()
        except TimeoutError:
            return None

    async def next_event_unless(
        self, gone: asyncio.Future[None], timeout_s: float
    ) -> Answer | None:
        """:meth:`next_event`, or None as soon as ``gone`` is done (the client left)."""
        if (queued := self.pending_event()) is not None:
            return queued
        getter = asyncio.ensure_future(self._events.get())
        try:
            done, _ = await asyncio.wait(
                (getter, gone), timeout=max(timeout_s, 0.0), return_when="FIRST_COMPLETED"
            )
        finally:
            if not getter.done():
                getter.cancel()  # the queue keeps an event a cancelled get did not take
        return getter.result() if getter in done else None

    def pending_event(self) -> Answer | None:
        """The next event if one is already queued, else None (never waits)."""
        with contextlib.suppress(asyncio.QueueEmpty):
            return self._events.get_nowait()
        return None

    def offer_chunk(self, chunk: OutputChunk) -> bool:
        """Queue ``chunk`` unless it is a repeat; True if new. Chunks that come after the
        completion are still queued: the completion travels on another topic and may
        overtake them."""
        key = (chunk.epoch, chunk.index)
        if key in self._seen:
            return False
        self._seen.add(key)
        self._epoch = max(self._epoch, chunk.epoch)
        if self.stream:
            self._events.put_nowait(chunk)
        return True

    def offer_completion(self, completion: Completion) -> bool:
        """Resolve with ``completion`` unless already resolved or it is stale; True if used."""
        if self.done or completion.epoch < self._epoch:
            return False
        self._completion.set_result(completion)
        if self.stream:
            self._events.put_nowait(completion)
        return True


class AnswerRegistry:
    """Waiters by request id, for the replica called ``instance_id``.

    Several waiters may wait for one request id (a client retrying with the same
    ``request_id`` while the first call still waits); each gets every answer.

    Attributes:
        instance_id: every request's ``reply_to``.
        reply_partition: the partition of the answers topic this replica reads, every
            request's ``reply_partition`` (None: answers do not come over the bus; the
            calls poll the records).
    """

    def __init__(
        self,
        instance_id: str,
        reply_partition: int | None = None,
        *,
        on_completion: Callable[[Completion], None] | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.reply_partition = reply_partition
        self.on_completion = on_completion
        """Told of every completion delivered, waited for or not (the admission gate
        learns from them)."""
        self._waiters: dict[str, list[Waiter]] = {}

    def overdue(self, age_s: float) -> list[str]:
        """Request ids whose first waiter has waited longer than ``age_s``."""
        cutoff = time.monotonic() - age_s
        return [rid for rid, waiters in self._waiters.items() if waiters[0].registered_s < cutoff]

    def register(self, request_id: str, *, stream: bool = False) -> Waiter:
        """A new waiter for ``request_id``; register before publishing the request, so a
        fast answer cannot arrive before anybody waits for it."""
        waiter = Waiter(request_id, stream=stream)
        self._waiters.setdefault(request_id, []).append(waiter)
        return waiter

    def release(self, waiter: Waiter) -> None:
        """Stop waiting; later answers for the request are dropped."""
        waiters = self._waiters.get(waiter.request_id)
        if waiters is None:
            return
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)
        if not waiters:
            del self._waiters[waiter.request_id]

    @contextlib.contextmanager
    def waiting(self, request_id: str, *, stream: bool = False) -> Iterator[Waiter]:
        """:meth:`register` on entry, :meth:`release` on exit."""
        waiter = self.register(request_id, stream=stream)
        try:
            yield waiter
        finally:
            self.release(waiter)

    def is_waited_for(self, request_id: str) -> bool:
        return request_id in self._waiters

    def deliver(self, answer: Answer) -> bool:
        """Hand ``answer`` to the waiters of its request; False when nobody used it."""
        if self.on_completion is not None and isinstance(answer, Completion):
            self.on_completion(answer)
        used = False
        for waiter in list(self._waiters.get(answer.request_id, ())):
            if isinstance(answer, Completion):
                used = waiter.offer_completion(answer) or used
            else:
                used = waiter.offer_chunk(answer) or used
        return used

    def __len__(self) -> int:
        """How many request ids have waiters."""
        return len(self._waiters)
