"""The event loop every long-running entry point runs on.

Services (:func:`~switchyard.runtime.main_for`, ``switchyard service``), ``switchyard
up``, ``switchyard demo`` and ``python -m loadgen replay`` call :func:`run` instead of
:func:`asyncio.run`: it runs the coroutine on uvloop's event loop when uvloop is
installed (a core dependency; its loop is a faster drop-in for asyncio's), and on
asyncio's default loop otherwise. Tests keep pytest-asyncio's loops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_log = logging.getLogger(__name__)

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default) when uvloop is missing."""
    try:
        import uvloop
    except ImportError:
        _log.debug("uvloop is not installed: running on asyncio's default event loop")
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop and close it, like :func:`asyncio.run`
    (same cancellation of what is left, same Ctrl-C handling), on uvloop when installed."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
