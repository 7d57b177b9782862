"""The cyclic garbage collector, set for services that answer within milliseconds.

:func:`settle_heap` runs once a process has started (every service, ``switchyard up``);
:func:`collector_paused` wraps a decision whose tail latency counts (the scheduler's
window plan; the window simulator times it the same way).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["YOUNG_COLLECTION_ALLOCATIONS", "collector_paused", "settle_heap"]

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


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection inside the block; the youngest generation collected right after it.

    For a decision whose tail latency counts (a window plan): with
    :data:`YOUNG_COLLECTION_ALLOCATIONS` a collection that falls inside it scans thousands
    of the decision's own objects while they are alive, and costs milliseconds; right
    after, they are garbage and the same collection costs tens of microseconds
    (``bench/selection_bench.py`` measures both). Inside a caller that disabled the
    collector it changes nothing.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)
