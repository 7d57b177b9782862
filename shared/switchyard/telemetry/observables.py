"""Observable instruments that several objects of one process feed.

A meter provider keeps the first callback of an observable instrument and silently
drops the callbacks of a second registration under the same name. The embedded stack
runs several workers (and every other service) on one meter provider, so each
``switchyard.worker.queue_length`` callback registered by a worker after the first
would be lost. :func:`observe` registers the instrument once per meter provider and
name, and calls every registered callback on each collection; an owner's callback (a
bound method) is held weakly, so a discarded service stops reporting.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Literal, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from switchyard import __version__

log = logging.getLogger(__name__)

ObservableKind = Literal["gauge", "counter", "up_down_counter"]
Observe = Callable[[], Iterable[Observation]]


class _Group:
    """One observable instrument and the callbacks feeding it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], Observe | None]] = []

    def add(self, callback: Observe) -> None:
        ref: Callable[[], Observe | None]
        if hasattr(callback, "__self__") and hasattr(callback, "__func__"):
            ref = weakref.WeakMethod(callback)  # a bound method
        else:

            def ref() -> Observe:
                return callback

        with self._lock:
            self._callbacks.append(ref)

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            refs = list(self._callbacks)
        found: list[Observation] = []
        dead: list[Callable[[], Observe | None]] = []
        for ref in refs:
            callback = ref()
            if callback is None:
                dead.append(ref)
                continue
            try:
                found.extend(callback())
            except Exception:  # a metric must never break a collection
                log.debug("an observable callback failed", exc_info=True)
        if dead:
            with self._lock:
                self._callbacks = [r for r in self._callbacks if r not in dead]
        return found


_GROUPS: weakref.WeakKeyDictionary[object, dict[str, _Group]] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


def observe(
    meter_provider: MeterProvider,
    scope: str,
    name: str,
    callback: Observe,
    *,
    kind: ObservableKind = "gauge",
    unit: str = "",
    description: str = "",
) -> None:
    """Feed the observable instrument ``name`` of ``meter_provider`` with ``callback``.

    The instrument is created (in meter ``scope``) by the first call for its name; later
    calls add their callback to it, whatever their ``scope``, ``kind``, ``unit`` and
    ``description``. ``callback`` returns the observations of one collection; it may run
    in an exporter's thread, so it should only read. A bound method is held weakly.
    """
    with _GROUPS_LOCK:
        groups = _GROUPS.setdefault(meter_provider, {})
        group = groups.get(name)
        if group is None:
            group = groups[name] = _Group()
            meter = meter_provider.get_meter(scope, __version__)
            create = {
                "gauge": meter.create_observable_gauge,
                "counter": meter.create_observable_counter,
                "up_down_counter": meter.create_observable_up_down_counter,
            }[kind]
            create(name, callbacks=[group.observe], unit=unit, description=description)
    group.add(callback)


InstrumentSet = TypeVar("InstrumentSet")

_SETS: weakref.WeakKeyDictionary[object, dict[tuple[str, object], object]] = (
    weakref.WeakKeyDictionary()
)
_SETS_LOCK = threading.Lock()


def instruments_once(
    meter_provider: MeterProvider | None, scope: str, build: Callable[[Meter], InstrumentSet]
) -> InstrumentSet:
    """The set of instruments ``build`` makes on meter ``scope`` of ``meter_provider``
    (None: the process-wide one), built once per provider, scope and ``build`` and shared
    by every later caller: registering an observable instrument a second time keeps the
    first callback only, so every object feeding it must share the counts it reads."""
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _SETS_LOCK:
        sets = _SETS.setdefault(provider, {})
        found = sets.get((scope, build))
        if found is None:
            found = sets[scope, build] = build(metrics.get_meter(scope, __version__, provider))
        return found  # type: ignore[return-value]


__all__ = ["InstrumentSet", "ObservableKind", "Observe", "instruments_once", "observe"]
