"""The event loop every long-running entry point runs on.

Services (:func:`~switchyard.runtime.main_for`, ``switchyard service``), ``switchyard
up``, ``switchyard demo`` and ``python -m loadgen replay`` call :func:`run` instead of
:func:`asyncio.run`: it runs the coroutine on uvloop's event loop when uvloop is
installed (a core dependency; its loop is a faster drop-in for asyncio's), and on
asyncio's default loop otherwise. Tests keep pytest-asyncio's loops.
"""

from __future__ import annotations

import asyncio
import gc
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


YOUNG_COLLECTION_ALLOCATIONS = 10_000
"""Net allocations of tracked objects between two collections of the youngest generation
(CPython's default is 700). A request allocates thousands of short-lived objects (parsed
bodies, messages, spans), so the default collects several times a request, and every
tenth of those scans older objects too; measured in ``bench.ingress_app_bench``, a tenth
of the app's CPU a call went to the collector."""


def settle_heap() -> None:
    """Collect once and move everything alive now (imported modules, models, catalogues)
    into the collector's permanent generation, once a process has started; from then on,
    collect the youngest generation every :data:`YOUNG_COLLECTION_ALLOCATIONS`.

    A full collection scans every tracked object; without this, one in a service that
    holds torch, scikit-learn and the catalogues takes long enough to stall the event
    loop (seen as 150 ms gaps in the embedded demo). What start-up built stays alive
    anyway; only what the service allocates from here on is scanned.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, older, oldest)
