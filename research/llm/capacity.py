"""Capacity search: the highest load at which a policy still meets its SLOs.

Operators provision by capacity, not by latency at one load: how many requests a second
a cluster serves while at least 90 % (or 99 %) of them meet every objective
(:mod:`switchyard.slo`), and the most goodput it can give. :func:`search_capacity`
finds these by simulating the trace at chosen load scales (arrival gaps divided by the
scale):

1. bracket the lowest attainment target: from ``start_scale``, double the load while
   the target holds (halve it while it does not) until one probe holds and the next
   fails, within ``[min_scale, max_scale]``;
2. bisect (geometrically) between the two until they are within ``tolerance`` of each
   other;
3. every stricter target starts from the probes already made (its threshold is at or
   below the lenient one's), halves the load further if even the lowest probe missed
   it, and is bisected the same way.

A target's capacity is the highest load probed below the lowest probed load that
missed it, reported with that miss, so the answer is exact to the tolerance when
attainment falls with load. It need not fall strictly: a policy can hold 99 % at one
load, miss it just above and hold it again higher up. The search then reports the
first edge, the conservative one, and the probes are kept so that a reader can see it.
Maximum goodput is the highest goodput among the loads probed, which cluster around the
knees where goodput peaks.

The search is pure over ``evaluate`` (a load scale in, what the simulation measured
out), so it is checked on synthetic curves and reused by any simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["CapacityPoint", "CapacityResult", "TargetCapacity", "search_capacity"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityPoint:
    """What one probe at one load scale measured (means over seeds)."""

    load_scale: float
    offered_rps: float
    slo_attainment: float
    goodput_rps: float
    ttft_p99_s: float
    tpot_p99_s: float
    p99_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetCapacity:
    """The capacity at one attainment target."""

    target: float
    """Share of requests meeting every objective, 0..1."""
    held: CapacityPoint | None
    """The highest load probed that met the target (None: not even ``min_scale``)."""
    failed: CapacityPoint | None
    """The lowest load probed above it that missed (None: ``max_scale`` still held)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityResult:
    targets: tuple[TargetCapacity, ...]
    max_goodput: CapacityPoint
    probes: tuple[CapacityPoint, ...]
    """Every load simulated, in increasing load."""


def search_capacity(
    evaluate: Callable[[float], CapacityPoint],
    *,
    targets: Sequence[float] = (0.90, 0.99),
    start_scale: float = 1.0,
    min_scale: float = 1 / 64,
    max_scale: float = 256.0,
    tolerance: float = 0.02,
) -> CapacityResult:
    """Search the capacity of one policy (see the module docstring).

    Args:
        evaluate: simulates the trace at a load scale; called once per probed scale.
        targets: attainment targets in (0, 1].
        tolerance: relative gap at which a bracket is narrow enough (0.02: 2 %).

    Raises:
        ValueError: a target outside (0, 1], an empty target list, or bounds that do
            not hold ``start_scale``.
    """
    if not targets:
        raise ValueError("at least one attainment target is needed")
    for target in targets:
        if not 0 < target <= 1:
            raise ValueError(f"an attainment target must be within (0, 1], got {target!r}")
    if not 0 < min_scale <= start_scale <= max_scale:
        raise ValueError(
            f"need 0 < min_scale <= start_scale <= max_scale, got {min_scale!r}, "
            f"{start_scale!r}, {max_scale!r}"
        )
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    probes: dict[float, CapacityPoint] = {}

    def probe(scale: float) -> CapacityPoint:
        if scale not in probes:
            probes[scale] = evaluate(scale)
        return probes[scale]

    ordered = sorted(set(targets))
    lenient = ordered[0]
    # 1. Bracket the most lenient target by doubling or halving.
    scale = start_scale
    if probe(scale).slo_attainment >= lenient:
        while scale < max_scale and probe(scale).slo_attainment >= lenient:
            scale = min(scale * 2, max_scale)
    else:
        while scale > min_scale and probe(scale).slo_attainment < lenient:
            scale = max(scale / 2, min_scale)
    found = [_bisect(probe, probes, target, tolerance, min_scale) for target in ordered]
    by_target = dict(zip(ordered, found, strict=True))
    points = tuple(probes[s] for s in sorted(probes))
    return CapacityResult(
        targets=tuple(by_target[t] for t in targets),
        max_goodput=max(points, key=lambda p: p.goodput_rps),
        probes=points,
    )


def _bisect(
    probe: Callable[[float], CapacityPoint],
    probes: dict[float, CapacityPoint],
    target: float,
    tolerance: float,
    min_scale: float,
) -> TargetCapacity:
    """Narrow the bracket of ``target`` among the probes made so far."""
    while True:
        held, failed = _bracket(probes, target)
        if held is None and failed is not None and failed.load_scale > min_scale:
            probe(max(failed.load_scale / 2, min_scale))
            continue
        if held is None or failed is None:
            return TargetCapacity(target=target, held=held, failed=failed)
        if failed.load_scale <= held.load_scale * (1 + tolerance):
            return TargetCapacity(target=target, held=held, failed=failed)
        probe(math.sqrt(held.load_scale * failed.load_scale))


def _bracket(
    probes: dict[float, CapacityPoint], target: float
) -> tuple[CapacityPoint | None, CapacityPoint | None]:
    """The highest probe that held ``target`` below the lowest probe that failed it."""
    ordered = [probes[s] for s in sorted(probes)]
    first_fail = next((i for i, p in enumerate(ordered) if p.slo_attainment < target), None)
    if first_fail is None:
        return (ordered[-1] if ordered else None), None
    held = ordered[first_fail - 1] if first_fail > 0 else None
    return held, ordered[first_fail]
