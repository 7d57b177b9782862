"""What one simulation run measured, and how it is summarised.

Latency is arrival to last token; TTFT arrival to first token; TPOT the time per output
token after the first (:mod:`switchyard.slo`). ``slo_violation_rate`` judges end-to-end
latency alone (the GAPS paper's objective); ``slo_attainment`` is the share of requests
that met every objective (TTFT and TPOT by workload class, and end to end), and
``goodput_rps`` those requests per second of the trace's arrival window (first to last
arrival: the drain after the last arrival is not counted, so a short trace is not
charged for its last requests' tail, and goodput is attainment times the offered rate).
Rejected requests (too large for any worker) and refused ones (the policy's admission
said no) are misses in all three. Utilisation of a worker is the time average of its
binding resource in use (batch slots or KV-cache memory, 1.0 while requests wait);
``load_cov`` is the coefficient of variation of that average across workers (0 is a
perfectly even spread). Quantiles interpolate linearly between order statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.contracts.fields import WorkloadType
from switchyard.slo import TokenSlo, judge, time_per_output_token_s
from switchyard.stats import coefficient_of_variation, quantiles

from research.llm.request import SimRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMetrics:
    requests: int
    completed: int
    rejected: int
    """Requests larger than any worker's KV cache: never admitted."""
    refused: int
    """Requests the policy's admission refused (:mod:`switchyard.policies.admission`)."""
    p50_s: float
    p90_s: float
    p99_s: float
    mean_latency_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    slo_violation_rate: float
    """End-to-end latency objective missed (or rejected), over all requests."""
    ttft_attainment: float
    tpot_attainment: float
    slo_attainment: float
    """Every objective met, over all requests."""
    goodput_rps: float
    migrations: int
    migration_cost_s: float
    mean_utilization: float
    load_cov: float
    throughput_rps: float
    predictor_mape: float | None
    """Mean absolute percentage error of the raw predictions against the observed
    service times (None when the policy predicts nothing)."""
    decisions: int
    latency_quantiles_s: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency_quantiles_s"] = list(self.latency_quantiles_s)
        return data


@dataclass(frozen=True, slots=True)
class RunTotals:
    """What a finished run hands to :func:`summarise`."""

    requests: Sequence[SimRequest]
    completed: Sequence[SimRequest]
    util_areas_s: Sequence[float]
    """Per instance, the time integral of its binding resource in use."""
    migrations: int
    migration_cost_s: float
    decisions: int


def summarise(
    run: RunTotals,
    *,
    start_s: float,
    end_s: float,
    rejected: int,
    refused: int = 0,
    token_slos: Mapping[WorkloadType, TokenSlo],
    last_arrival_s: float,
) -> RunMetrics:
    done = run.completed
    latencies: list[float] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    violations = ttft_met = tpot_met = all_met = 0
    for r in done:
        latency_s = r.finished_s - r.arrival_s
        ttft_s = r.first_token_s - r.arrival_s
        tpot_s = time_per_output_token_s(r.first_token_s, r.finished_s, r.output_tokens)
        latencies.append(latency_s)
        ttfts.append(ttft_s)
        if tpot_s is not None:
            tpots.append(tpot_s)
        outcome = judge(
            token_slos[r.workload],
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            latency_s=latency_s,
            latency_slo_s=r.slo_s,
        )
        violations += not outcome.latency_met
        ttft_met += outcome.ttft_met
        tpot_met += outcome.tpot_met
        all_met += outcome.met
    latencies.sort()
    ttfts.sort()
    tpots.sort()
    total = len(run.requests)
    duration_s = max(end_s - start_s, 1e-9)
    # One arrival (or all at once) has no window: the run's duration stands in.
    arrival_window_s = last_arrival_s - start_s if last_arrival_s > start_s else duration_s
    utils = [area_s / duration_s for area_s in run.util_areas_s]
    mean_util = sum(utils) / len(utils)
    errors = [
        abs(r.predicted_s[r.served_by] - (r.finished_s - r.started_s))
        / max(r.finished_s - r.started_s, 1e-9)
        for r in done
        if r.served_by in r.predicted_s
    ]
    # i / 100 is the double nearest 0.5, 0.9 and 0.99 at 50, 90 and 99: the same figures.
    percentiles_s = quantiles(latencies, tuple(i / 100 for i in range(101)))
    p50_s, p90_s, p99_s = percentiles_s[50], percentiles_s[90], percentiles_s[99]
    ttft_p50_s, ttft_p99_s = quantiles(ttfts, (0.50, 0.99))
    tpot_p50_s, tpot_p99_s = quantiles(tpots, (0.50, 0.99))
    return RunMetrics(
        requests=total,
        completed=len(done),
        rejected=rejected,
        refused=refused,
        p50_s=p50_s,
        p90_s=p90_s,
        p99_s=p99_s,
        mean_latency_s=sum(latencies) / len(latencies) if latencies else math.nan,
        ttft_p50_s=ttft_p50_s,
        ttft_p99_s=ttft_p99_s,
        tpot_p50_s=tpot_p50_s,
        tpot_p99_s=tpot_p99_s,
        slo_violation_rate=(violations + rejected + refused) / total if total else 0.0,
        ttft_attainment=ttft_met / total if total else 0.0,
        tpot_attainment=tpot_met / total if total else 0.0,
        slo_attainment=all_met / total if total else 0.0,
        goodput_rps=all_met / arrival_window_s,
        migrations=run.migrations,
        migration_cost_s=run.migration_cost_s,
        mean_utilization=mean_util,
        load_cov=coefficient_of_variation(utils),
        throughput_rps=len(done) / duration_s,
        predictor_mape=sum(errors) / len(errors) if errors else None,
        decisions=run.decisions,
        latency_quantiles_s=percentiles_s,
    )
