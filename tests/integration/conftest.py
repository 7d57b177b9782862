"""Fixtures of the integration tier: stacks of services as separate processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loadgen.harness.process_stack import ProcessStack, StackFactory


@pytest.fixture
async def process_stack(
    kafka_bootstrap: str, redis_url: str, unique_prefix: str, tmp_path: Path
) -> AsyncIterator[StackFactory]:
    """Make process stacks; every one is stopped (SIGTERM, then SIGKILL) and its topics
    and keys deleted at the end. Logs stay under the test's ``tmp_path``."""
    made: list[ProcessStack] = []

    def make(**options: Any) -> ProcessStack:
        stack = ProcessStack(
            kafka_bootstrap,
            redis_url,
            f"{unique_prefix.rstrip('.')}{len(made)}",
            tmp_path / f"logs{len(made)}",
            **options,
        )
        made.append(stack)
        return stack

    yield make
    for stack in made:
        await stack.close()
