"""What one simulation run measured, and how it is summarised.

Latency is arrival to last token. Utilisation of a worker is the time average of its
binding resource in use (batch slots or KV-cache memory, 1.0 while requests wait);
``load_cov`` is the coefficient of variation of that average across workers (0 is a
perfectly even spread). Quantiles interpolate linearly between order statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.stats import coefficient_of_variation, quantile

from research.llm.request import SimRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMetrics:
    requests: int
    completed: int
    rejected: int
    """Requests larger than any worker's KV cache: never admitted."""
    p50_s: float
    p90_s: float
    p99_s: float
    mean_latency_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    slo_violation_rate: float
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


def summarise(run: RunTotals, *, start_s: float, end_s: float, rejected: int) -> RunMetrics:
    done = run.completed
    latencies = sorted(r.finished_s - r.arrival_s for r in done)
    ttfts = sorted(r.first_token_s - r.arrival_s for r in done)
    violations = sum(1 for r in done if r.finished_s - r.arrival_s > r.slo_s)
    total = len(run.requests)
    duration_s = max(end_s - start_s, 1e-9)
    utils = [area_s / duration_s for area_s in run.util_areas_s]
    mean_util = sum(utils) / len(utils)
    errors = [
        abs(r.predicted_s[r.served_by] - (r.finished_s - r.started_s))
        / max(r.finished_s - r.started_s, 1e-9)
        for r in done
        if r.served_by in r.predicted_s
    ]
    return RunMetrics(
        requests=total,
        completed=len(done),
        rejected=rejected,
        p50_s=quantile(latencies, 0.50),
        p90_s=quantile(latencies, 0.90),
        p99_s=quantile(latencies, 0.99),
        mean_latency_s=sum(latencies) / len(latencies) if latencies else math.nan,
        ttft_p50_s=quantile(ttfts, 0.50),
        ttft_p99_s=quantile(ttfts, 0.99),
        slo_violation_rate=(violations + rejected) / total if total else 0.0,
        migrations=run.migrations,
        migration_cost_s=run.migration_cost_s,
        mean_utilization=mean_util,
        load_cov=coefficient_of_variation(utils),
        throughput_rps=len(done) / duration_s,
        predictor_mape=sum(errors) / len(errors) if errors else None,
        decisions=run.decisions,
        latency_quantiles_s=tuple(quantile(latencies, i / 100) for i in range(101)),
    )
