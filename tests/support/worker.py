"""Test doubles for the worker's backends."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.contracts.messages import Result

from services.worker.backends.base import Preemption
from services.worker.queue import WorkItem


class Sink:
    """Records what a backend reports, as the worker service would receive it."""

    def __init__(self) -> None:
        self.started_ids: list[str] = []
        self.token_counts: dict[str, int] = {}
        self.texts: dict[str, str] = {}
        self.results: dict[str, Result] = {}
        self.errors: dict[str, str] = {}
        self.handoffs: dict[str, Preemption] = {}

    async def started(self, items: Sequence[WorkItem]) -> None:
        self.started_ids.extend(item.request_id for item in items)

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        self.token_counts[item.request_id] = self.token_counts.get(item.request_id, 0) + new_tokens
        self.texts[item.request_id] = self.texts.get(item.request_id, "") + text

    async def finished(self, item: WorkItem, result: Result) -> None:
        self.results[item.request_id] = result

    async def failed(self, item: WorkItem, error: str) -> None:
        self.errors[item.request_id] = error

    async def prefill_done(self, item: WorkItem, handoff: Preemption) -> None:
        self.handoffs[item.request_id] = handoff
