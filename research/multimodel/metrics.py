"""The figures of a multi-model run, each defined precisely.

Notation: a run has workers ``w = 1..W`` and lasts ``T`` seconds of virtual time (from 0
to its last completion, or to the drain cutoff). Request ``i`` arrives at ``a_i`` with
latency ``l_i`` (end of its last stage minus ``a_i``; a request unfinished when the run
stopped counts with its censored latency, end of run minus ``a_i``) and its pipeline's
SLO ``slo_i``. Latency windows are ``[k*w_s, (k+1)*w_s)`` of *arrival* time (``w_s`` =
``window_s``): the latency a request arriving then experienced; a window without
arrivals is skipped.

utilization (%)
    ``100 * (1/W) * sum_w (1/T) * integral_0^T min(1, share_w(t)) dt`` where
    ``share_w(t)`` is the dominant share (largest of cpu, gpu, mem) of worker ``w``'s
    capacity taken by the replicas *serving a stage* at ``t``. Resident but idle models
    do not count, nor do loading ones: utilisation is work done, not memory held. It is
    resource-weighted (a small model busy on a large GPU uses little of it), so a policy
    cannot raise it by spreading one tiny model everywhere; the dominant share is the
    standard single figure for multi-resource use (dominant resource fairness). Example:
    two workers over 10 s, the first serving a half-GPU model for 4 s, the second idle:
    ``100 * (0.5*4/10 + 0) / 2 = 10 %``.

load_cov
    Coefficient of variation of worker load: ``std(u_w) / mean(u_w)`` over workers,
    population standard deviation, with ``u_w`` the per-worker utilisation above (the
    same integral, one worker). Capacity-normalised, so a fast worker doing twice the
    work of a slow one at the same share counts as balanced. 0 when every worker is idle.
    Lower is better. Example: ``u = (0.2, 0.6)`` -> mean 0.4, std 0.2, CoV 0.5.

stability
    Variability of latency *in steady operation*, measured within steady segments.
    The run is cut into segments at the workload's step (``Workload.step_at_s``, if
    any): ``[0, step)`` and ``[step, end)``. From each segment the first
    ``transient_s`` seconds (:data:`STABILITY_TRANSIENT_S`, 30 s) are dropped: the
    warm-up from an empty cluster and the reaction to the step are transients, which
    responsiveness measures, not steady-state variability. Within a segment ``g`` with
    windows ``k`` (``m_k`` the mean latency of window ``k``), ``stab_g = clip(1 -
    std(m_k) / mean(m_k), 0, 1)`` (population standard deviation); stability is the
    mean of ``stab_g`` weighted by each segment's number of windows (segments with
    fewer than two windows are skipped; if none is left, the whole run is one segment).
    The latency *level* may differ between segments (the offered load differs); only
    the variation around each segment's own level counts. 1 is a flat latency series;
    0 is variability as large as the mean or larger. Example: window means ``(1, 2,
    3)`` in one segment -> std 0.8165, mean 2, stability 0.5918; segments ``(1, 1)``
    and ``(1, 2, 3)`` -> ``(2 * 1 + 3 * 0.5918) / 5 = 0.7551``.

    Why segments and the transient cut: an earlier definition took ``1 - CoV`` over
    every window of the run. Each run starts with no model resident (the first
    windows wait up to the longest load time, 17 s on the synthetic mix) and the
    synthetic mix doubles its rate halfway; both swamp the steady-state variation, so
    every policy with a low steady latency scored 0 (a 6 s warm-up window against
    0.3 s steady windows gives a CoV above 1) whatever its behaviour afterwards. The
    paper's stability is the variance of latency over time windows in operation; the
    adaptation to a change is its separate responsiveness metric.

responsiveness_s
    Settling time after the workload's step (``Workload.step_at_s``): the windows that
    start at or after the step are ``k_0, k_0+1, ..., k_n``; the *new steady state* is
    the mean of ``m_k`` over the last third of them (at least one window); each window
    is smoothed with the two before it (``s_k``, the mean of ``m_{k-2..k}`` among those
    windows); the response settles at the first window ``k`` from which every later
    ``s_k`` is within 25 % of the steady state; responsiveness = end of that window minus
    the step time (resolution ``window_s``). ``None`` when the workload has no step or no
    window starts after it. If even the last window is outside the band, the value is
    the end of the last window minus the step (censored). Example: step at 100 s,
    windows of 10 s from 100 s with means ``(5, 3, 2.1, 2, 2, 2)``: steady state 2, smoothed
    ``(5, 4, 3.37, 2.37, 2.03, 2)``, band [1.5, 2.5]; the fourth window, [130, 140), is
    the first from which all stay inside: 140 - 100 = 40 s.

    Why smoothed, and 25 %: the first definition judged single 5 s windows against a
    10 % band, narrower than the wobble of steady windows themselves (a stability of
    0.85 is a window CoV of 0.15), so every policy on the synthetic mix read 118 to 150
    s, censored, and the metric separated nothing. Three windows (15 s) cut that noise
    by about the square root of three, and 25 % is about two and a half of its standard
    deviations; on the synthetic mix (three seeds) it reads 5 s for the adaptive
    policies, 55 to 90 s for static round robin, 5 to 65 s for the threshold policy and
    145 to 150 s (never settling) for the two that re-place on every update.

p99_s
    The 99th percentile of ``l_i`` over all requests (linear interpolation between
    order statistics, as ``numpy.percentile``'s default).

slo_violation_rate
    The share of requests with ``l_i > slo_i``; an unfinished request counts as a
    violation.

decision_p99_s / decision_mean_s
    Wall-clock seconds of one placement update (the policy's ``place`` call,
    measured by the shell around it), 99th percentile and mean over the run's updates.

placement_changes
    Loads plus evictions carried out over the run.

llm_utilization (%)
    The LLM workers of a run with LLM stages (:mod:`research.multimodel.llm_stages`):
    ``100 * (1/L) * sum_l busy_l / T``, ``busy_l`` the seconds LLM worker ``l`` spent
    prefilling or decoding. A decoding batch counts as busy whatever its size. None
    (``-`` in tables) for a run without LLM workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.stats import coefficient_of_variation, quantile

from research.multimodel.simulator import MultiModelResult

__all__ = [
    "MultiModelMetrics",
    "coefficient_of_variation",
    "percentile",
    "responsiveness_s",
    "stability",
    "steady_stability",
    "summarize",
    "windowed_means",
]

RESPONSIVENESS_BAND = 0.25
RESPONSIVENESS_SMOOTHING_WINDOWS = 3
"""Windows averaged (the window and the ones before it) before judging the settling."""
STABILITY_TRANSIENT_S = 30.0
"""Seconds dropped from the start of each steady segment (warm-up and the step)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiModelMetrics:
    """The figures of one run (see the module docstring for each definition)."""

    utilization: float
    load_cov: float
    stability: float
    responsiveness_s: float | None
    p99_s: float
    mean_latency_s: float
    slo_violation_rate: float
    decision_p99_s: float
    decision_mean_s: float
    placement_changes: int
    updates: int
    requests: int
    unfinished: int
    stages_run: int
    llm_utilization: float | None = None
    """Mean over the LLM workers of the share of the run they spent prefilling or
    decoding, in %; None without LLM workers."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between order statistics; NaN if empty.

    Example: ``percentile([1, 2, 3, 4], 50) == 2.5``.
    """
    return quantile(values, q / 100.0)


def windowed_means(
    arrivals_s: Sequence[float], latencies_s: Sequence[float], window_s: float
) -> list[tuple[float, float]]:
    """``(window start, mean latency)`` per window of arrival time, empty windows skipped.

    Example: arrivals ``(0, 1, 6)``, latencies ``(1, 3, 2)``, ``window_s=5`` ->
    ``[(0.0, 2.0), (5.0, 2.0)]``.
    """
    sums: dict[int, list[float]] = {}
    for arrival, latency in zip(arrivals_s, latencies_s, strict=True):
        cell = sums.setdefault(int(arrival // window_s), [0.0, 0.0])
        cell[0] += latency
        cell[1] += 1.0
    return [(k * window_s, s / c) for k, (s, c) in sorted(sums.items())]


def stability(window_means: Sequence[float]) -> float:
    """``clip(1 - std / mean, 0, 1)`` of the windowed mean latencies (1.0 if < 2 windows).

    Example: ``stability([1, 2, 3])`` = 1 - 0.8165 / 2 = 0.5918.
    """
    if len(window_means) < 2:
        return 1.0
    return min(1.0, max(0.0, 1.0 - coefficient_of_variation(window_means)))


def steady_stability(
    windows: Sequence[tuple[float, float]],
    step_at_s: float | None,
    transient_s: float = STABILITY_TRANSIENT_S,
) -> float:
    """Stability within steady segments (module docstring): the window-count-weighted
    mean of :func:`stability` over ``[transient_s, step)`` and ``[step + transient_s,
    end)`` (just ``[transient_s, end)`` without a step).

    Example: windows at 0..40 s of 10 s, step ``None``, ``transient_s=10`` -> the
    windows at 10, 20, 30, 40 s form one segment.
    """
    bounds = [0.0] if step_at_s is None else [0.0, step_at_s]
    segments: list[list[float]] = [[] for _ in bounds]
    for start, mean in windows:
        g = len(bounds) - 1
        while g > 0 and start < bounds[g] - 1e-9:
            g -= 1
        if start >= bounds[g] + transient_s - 1e-9:
            segments[g].append(mean)
    kept = [segment for segment in segments if len(segment) >= 2]
    if not kept:
        return stability([mean for _, mean in windows])
    total = sum(len(segment) for segment in kept)
    return math.fsum(len(segment) * stability(segment) for segment in kept) / total


def responsiveness_s(
    windows: Sequence[tuple[float, float]],
    window_s: float,
    step_at_s: float | None,
    band: float = RESPONSIVENESS_BAND,
) -> float | None:
    """Settling time after ``step_at_s`` of windowed mean latency, smoothed over
    :data:`RESPONSIVENESS_SMOOTHING_WINDOWS` (module docstring).

    Example: step 100, ``window_s=10``, windows from 100 with means
    ``(5, 3, 2.1, 2, 2, 2)`` -> 40.0.
    """
    if step_at_s is None:
        return None
    after = [(start, mean) for start, mean in windows if start >= step_at_s - 1e-9]
    if not after:
        return None
    tail = after[-max(1, len(after) // 3) :]
    steady = math.fsum(mean for _, mean in tail) / len(tail)
    means = [mean for _, mean in after]
    span = RESPONSIVENESS_SMOOTHING_WINDOWS
    smoothed = [
        math.fsum(means[max(0, k - span + 1) : k + 1]) / (k + 1 - max(0, k - span + 1))
        for k in range(len(means))
    ]
    settled_at = len(after) - 1
    for k in range(len(after) - 1, -1, -1):
        if abs(smoothed[k] - steady) <= band * steady + 1e-12:
            settled_at = k
        else:
            break
    return after[settled_at][0] + window_s - step_at_s


def summarize(
    result: MultiModelResult,
    window_s: float | None = None,
    transient_s: float = STABILITY_TRANSIENT_S,
) -> MultiModelMetrics:
    """The figures of ``result`` (latency windows of ``window_s``, default the run's;
    ``transient_s`` cut from each steady segment for stability)."""
    width = window_s if window_s is not None else result.config.window_s
    horizon = result.end_s
    per_worker = [(share / horizon if horizon > 0 else 0.0) for share in result.worker_share_s]
    utilization = 100.0 * math.fsum(per_worker) / len(per_worker) if per_worker else 0.0
    windows = windowed_means(result.arrivals_s, result.latencies_s, width)
    violations = sum(
        1
        for latency, slo, done in zip(
            result.latencies_s, result.slo_s, result.finished, strict=True
        )
        if not done or latency > slo
    )
    n = len(result.latencies_s)
    decision_s = [u.decision_wall_s for u in result.updates]
    return MultiModelMetrics(
        utilization=utilization,
        load_cov=coefficient_of_variation(per_worker),
        stability=steady_stability(windows, result.step_at_s, transient_s),
        responsiveness_s=responsiveness_s(windows, width, result.step_at_s),
        p99_s=percentile(result.latencies_s, 99.0),
        mean_latency_s=math.fsum(result.latencies_s) / n if n else math.nan,
        slo_violation_rate=violations / n if n else 0.0,
        decision_p99_s=percentile(decision_s, 99.0) if decision_s else 0.0,
        decision_mean_s=math.fsum(decision_s) / len(decision_s) if decision_s else 0.0,
        placement_changes=result.placement_changes,
        updates=len(result.updates),
        requests=n,
        unfinished=sum(1 for done in result.finished if not done),
        stages_run=result.stages_run,
        llm_utilization=(
            100.0
            * math.fsum(result.llm_worker_busy_s.values())
            / (horizon * len(result.llm_worker_busy_s))
            if result.llm_worker_busy_s and horizon > 0
            else None
        ),
    )
