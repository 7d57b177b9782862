"""The open-loop replay engine: send a request plan to a live Switchyard ingress.

Request ``i`` of a plan is sent ``(arrival_i - arrival_0) / speedup`` seconds after the
start, whatever happened to the requests before it: one asyncio task per request
(:meth:`loadgen.replay_send.ReplayRun.send`) on a shared keep-alive client
(:mod:`loadgen.http_client`) that opens a connection whenever every open one is busy, so
no request waits for a connection. The client is lean on purpose: the generator's own CPU
per request is part of what a benchmark reports (``ReplayResult.cpu_s``), and at 1,000
requests/s a heavy client would measure itself. The dispatcher records, for each request,
when it was due (``scheduled_s``) and when it actually went out (``sent_s``); the
difference, ``send_lag_s``, says when the generator itself fell behind (a busy event
loop, a saturated client), so that such a run is not mistaken for a slow server.

A stopped replay (the ``stop`` event; Ctrl-C on the command line) sends nothing more and
gives the requests in flight ``grace_s`` seconds to answer; those still unanswered are
recorded as ``cancelled``, those never sent as ``not_sent``. What a record holds is in
:mod:`loadgen.replay_records`; how an answer is read, in :mod:`loadgen.replay_answers`.

Library use (what ``make demo`` calls in-process)::

    from loadgen.mixes import build_plan
    from loadgen.replay import replay
    from switchyard.traces import resolve_trace

    plan = build_plan(resolve_trace("azure-conv-sample"), "llm", limit=100)
    result = await replay(plan, "http://127.0.0.1:8000", speedup=10.0, timeout_s=60.0,
                          progress=False)
    # result.records: one RequestRecord per planned request;
    # loadgen.replay_summary.summarize(result.records, result.duration_s) turns them
    # into the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from switchyard.progress import Progress

from loadgen.mixes import PlannedRequest
from loadgen.replay_records import CANCELLED, ReplayResult, RequestRecord
from loadgen.replay_send import ReplayRun, open_client
from loadgen.replay_target import normalise_target

__all__ = [
    "new_run_id",
    "replay",
]

DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_GRACE_S = 5.0


def new_run_id() -> str:
    """A fresh run id: ``replay-<UTC time>-<6 hex digits>``."""
    return f"replay-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


async def _sleep_or_stop(delay_s: float, stop: asyncio.Event | None) -> None:
    """Sleep ``delay_s`` (yielding to the loop even when it is 0) or until ``stop`` is set."""
    if stop is None or delay_s <= 0:
        await asyncio.sleep(max(delay_s, 0.0))
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay_s)


async def _first_done(waiters: set[asyncio.Future[Any]], timeout_s: float | None) -> None:
    await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)


async def _wait_all(tasks: set[asyncio.Task[None]], stop: asyncio.Event | None) -> bool:
    """Wait for every task, or until ``stop`` is set; True when all finished.

    Each task counts itself off as it ends, so the wait costs nothing per answer (a
    replay of 100,000 requests must not rescan its tasks at every answer)."""
    pending = {task for task in tasks if not task.done()}
    if not pending:
        return True
    all_done = asyncio.Event()

    def finished(task: asyncio.Task[None]) -> None:
        pending.discard(task)
        if not pending:
            all_done.set()

    for task in pending:
        task.add_done_callback(finished)
    waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(all_done.wait())}
    if stop is not None:
        waits.add(asyncio.ensure_future(stop.wait()))
    try:
        await _first_done(waits, None)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    return all(task.done() for task in tasks)


async def _grace(
    tasks: set[asyncio.Task[None]], grace_s: float, abort: asyncio.Event | None
) -> None:
    """Wait up to ``grace_s`` for the unfinished tasks; ``abort`` ends the wait early."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    aborter: asyncio.Future[Any] | None = (
        asyncio.ensure_future(abort.wait()) if abort is not None else None
    )
    try:
        while not (abort is not None and abort.is_set()):
            waiters: set[asyncio.Future[Any]] = {t for t in tasks if not t.done()}
            remaining_s = deadline - loop.time()
            if not waiters or remaining_s <= 0:
                break
            if aborter is not None:
                waiters.add(aborter)
            await _first_done(waiters, remaining_s)
    finally:
        if aborter is not None:
            aborter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await aborter


async def replay(
    plan: Sequence[PlannedRequest],
    target: str,
    *,
    speedup: float = 1.0,
    timeout_s: float = 120.0,
    progress: bool = True,
    run_id: str | None = None,
    stop: asyncio.Event | None = None,
    abort: asyncio.Event | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.perf_counter,
    api_key: str | None = None,
) -> ReplayResult:
    """Send ``plan`` to ``target`` open-loop and record what became of every request.

    Request ``i`` goes out ``(plan[i].arrival_s - first arrival) / speedup`` seconds
    after the start, in its own task, however the earlier ones are doing.

    Args:
        plan: the requests (:func:`loadgen.mixes.build_plan`); sent in arrival order.
        target: the ingress base URL, e.g. ``http://127.0.0.1:8000``.
        speedup: divide the trace's inter-arrival times by this (> 0).
        timeout_s: client timeout of each request (> 0); past it the request is a
            ``timeout``.
        progress: show a progress bar on stderr.
        run_id: the prefix of request ids; default :func:`new_run_id`.
        stop: when set, no further request is sent; in-flight ones get ``grace_s``
            seconds to answer, then are cancelled and recorded as ``cancelled``.
            The CLI sets it on Ctrl-C.
        abort: when set during the grace period, ends it at once (a second Ctrl-C).
        grace_s: how long a stopped replay waits for in-flight answers.
        max_connections: the connection pool's size.
        transport: an httpx transport to use instead of the network (tests pass an
            ``httpx.ASGITransport``); the requests then go through httpx, as they do to
            an ``https://`` target. Otherwise the lean keep-alive client sends them.
        clock: a monotonic clock in seconds.
        api_key: sent as ``Authorization: Bearer`` (an ingress with API keys needs one).

    Returns:
        A :class:`ReplayResult` with one record per planned request, in plan order.

    Raises:
        TargetError: a malformed target URL.
        ValueError: ``speedup``, ``timeout_s`` or ``max_connections`` out of range.
    """
    base_url = normalise_target(target)
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"--speedup must be a finite number > 0, got {speedup:g}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"--timeout-s must be a finite number > 0, got {timeout_s:g}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    run_id = run_id or new_run_id()
    ordered = sorted(plan, key=lambda request: (request.arrival_s, request.index))
    first_s = ordered[0].arrival_s if ordered else 0.0
    # Bodies are encoded before the clock starts, so that encoding never delays a send.
    payloads = [
        json.dumps(request.body(run_id), separators=(",", ":")).encode() for request in ordered
    ]
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    stopped = False
    cpu_start_s = time.process_time()
    async with open_client(base_url, timeout_s, max_connections, transport, api_key) as client:
        with Progress(len(ordered), "replay", enabled=None if progress else False) as bar:
            run = ReplayRun(client, run_id, clock, bar)
            tasks: set[asyncio.Task[None]] = set()
            for request, payload in zip(ordered, payloads, strict=True):
                scheduled_s = (request.arrival_s - first_s) / speedup
                await _sleep_or_stop(run.start + scheduled_s - clock(), stop)
                if stop is not None and stop.is_set():
                    stopped = True
                    break
                tasks.add(asyncio.create_task(run.send(request, payload, scheduled_s)))
            finished = await _wait_all(tasks, stop)
            if not finished:
                stopped = True
                await _grace(tasks, grace_s, abort)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            end_s = clock() - run.start
    cpu_s = time.process_time() - cpu_start_s
    records: list[RequestRecord] = []
    for request in sorted(plan, key=lambda r: r.index):
        record = run.records.get(request.index)
        if record is None:
            scheduled_s = (request.arrival_s - first_s) / speedup
            fields = run.base_record(request, scheduled_s)
            if request.index in run.sent:
                _, sent_s = run.sent[request.index]
                fields.update(sent_s=sent_s, send_lag_s=sent_s - scheduled_s, outcome=CANCELLED)
            record = RequestRecord(**fields)
        records.append(record)
    duration_s = end_s if stopped else max(run.last_answer_s, 0.0)
    return ReplayResult(
        run_id=run_id,
        target=base_url,
        speedup=speedup,
        timeout_s=timeout_s,
        started_at=started_at,
        duration_s=duration_s,
        stopped=stopped,
        records=records,
        cpu_s=cpu_s,
    )
