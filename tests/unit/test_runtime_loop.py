"""switchyard.runtime.loop: the entry points' event loop (uvloop when installed)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop
from switchyard.runtime import loop as event_loop


async def _loop_in_use() -> asyncio.AbstractEventLoop:
    await asyncio.sleep(0)
    return asyncio.get_running_loop()


def test_run_uses_uvloop_when_it_is_installed() -> None:
    used = event_loop.run(_loop_in_use())
    assert isinstance(used, uvloop.Loop)
    assert used.is_closed()


def test_run_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now fails
    used = event_loop.run(_loop_in_use())
    assert not isinstance(used, uvloop.Loop)
    assert isinstance(used, asyncio.BaseEventLoop)


def test_run_returns_the_result_and_raises_the_error_of_the_coroutine() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def answers() -> int:
        return 42

    assert event_loop.run(answers()) == 42
    with pytest.raises(ValueError, match="boom"):
        event_loop.run(fails())


def test_run_cancels_what_the_coroutine_left_running() -> None:
    cancelled: list[bool] = []

    async def leaves_a_task() -> None:
        async def forever() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)

    event_loop.run(leaves_a_task())
    assert cancelled == [True]
