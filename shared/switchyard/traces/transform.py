"""Pure transforms of a :class:`Trace`: more or less load, a time window, the first N.

Every transform returns a new trace that keeps the :class:`Trace` invariants (sorted,
first arrival at 0.0 s), keeps ``source`` (the requests still come from there) and
records what was done in ``name``, so that a report's trace column says, e.g.,
``azure-conv[600s:1200s]*2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from switchyard.traces.azure import Trace, merge_by_arrival


def scale_load(trace: Trace, factor: float) -> Trace:
    """The same requests with inter-arrival times divided by ``factor``.

    ``factor`` 2 doubles the request rate (halves the duration); 0.5 halves it. The
    prompt and output lengths and the order of requests do not change.

    Raises:
        ValueError: ``factor`` is not a finite number > 0.
    """
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
    return Trace(
        name=f"{trace.name}*{factor:g}",
        source=trace.source,
        requests=tuple(replace(r, arrival_s=r.arrival_s / factor) for r in trace.requests),
    )


def window(trace: Trace, start_s: float, end_s: float | None = None) -> Trace:
    """The requests arriving in ``[start_s, end_s)``, rebased so the first is at 0.0 s.

    The rebase is to the first kept request, not to ``start_s``: a trace starts with a
    request by definition, so a quiet lead-in before it is dropped. ``end_s`` None
    keeps everything from ``start_s`` on.

    Raises:
        ValueError: ``start_s`` is negative or not finite, ``end_s`` is not after
            ``start_s``, or the window holds no requests.
    """
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"start_s must be a finite number >= 0, got {start_s!r}")
    if end_s is not None and not end_s > start_s:
        raise ValueError(f"end_s must be greater than start_s ({start_s:g}), got {end_s!r}")
    kept = [
        r
        for r in trace.requests
        if r.arrival_s >= start_s and (end_s is None or r.arrival_s < end_s)
    ]
    end_text = "" if end_s is None else f"{end_s:g}s"
    if not kept:
        raise ValueError(
            f"the window [{start_s:g} s, {end_text or 'end'}) of trace {trace.name!r} "
            f"holds no requests (the trace spans 0 to {trace.duration_s:g} s)"
        )
    first_s = kept[0].arrival_s
    return Trace(
        name=f"{trace.name}[{start_s:g}s:{end_text}]",
        source=trace.source,
        requests=tuple(replace(r, arrival_s=r.arrival_s - first_s) for r in kept),
    )


def head(trace: Trace, n: int) -> Trace:
    """The first ``n`` requests (all of them when the trace is shorter).

    Raises:
        ValueError: ``n`` is less than 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if n >= len(trace):
        return trace
    return Trace(name=f"{trace.name}[:{n}]", source=trace.source, requests=trace.requests[:n])


def interleave(name: str, traces: Sequence[Trace]) -> Trace:
    """Several traces as one, each keeping its own arrivals (so all start together).

    Ties keep the order of ``traces``. The ``source`` lists every source, joined by
    ``" + "``.

    Raises:
        ValueError: ``traces`` is empty.
    """
    if not traces:
        raise ValueError("traces must hold at least one trace")
    return Trace(
        name=name,
        source=" + ".join(t.source for t in traces),
        requests=tuple(merge_by_arrival(*(t.requests for t in traces))),
    )
