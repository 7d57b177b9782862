"""Several live replays of one pipeline slice against the simulator's jittered band: the
median of the live runs' P50 and P99 over the band's medians, per setting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from research.multimodel.agreement import PipelineAgreement, PipelineAgreementError, SimBand
from research.multimodel.agreement_runs import repeated

BAND = SimBand(
    jitter_s=0.2,
    seeds=40,
    p50_min_s=60.0,
    p50_median_s=80.0,
    p50_max_s=110.0,
    p99_min_s=380.0,
    p99_median_s=560.0,
    p99_max_s=630.0,
)


def run(live_p50_s: float, live_p99_s: float, *, time_scale: float = 50.0) -> PipelineAgreement:
    return PipelineAgreement(
        policy="adaptive-balanced",
        time_scale=time_scale,
        update_hz=5.0,
        workers=2,
        planned=200,
        answered_ok=200,
        complete_answers=200,
        not_ok={},
        sim_unfinished=0,
        compared=200,
        sim_p50_s=71.5,
        sim_p99_s=347.4,
        live_p50_s=live_p50_s,
        live_p99_s=live_p99_s,
        live_server_p50_s=None,
        live_server_p99_s=None,
        p50_ratio=live_p50_s / 71.5,
        p99_ratio=live_p99_s / 347.4,
        paired_gap_p50_s=0.0,
        max_send_lag_s=0.0,
        parts={},
        sim_stages_by_worker={},
        live_stages_by_worker={},
        band=BAND,
    )


def test_the_medians_of_the_live_runs_are_compared_with_the_bands() -> None:
    # Three draws of a bistable placement: single runs miss the deterministic
    # simulation (P99 x1.8, x2.0), their medians agree with the band's.
    runs = [run(73.0, 619.0), run(108.0, 689.0), run(88.0, 570.0)]
    assert not runs[0].within()
    assert not runs[1].within()
    (summary,) = repeated(runs)
    assert summary.runs == 3
    assert summary.live_p50_median_s == 88.0
    assert summary.live_p99_median_s == 619.0
    assert summary.p50_ratio == pytest.approx(88.0 / 80.0)
    assert summary.p99_ratio == pytest.approx(619.0 / 560.0)
    assert summary.within()
    assert not repeated([run(73.0, 900.0)])[0].within()


def test_each_setting_is_summarised_apart_in_the_order_first_met() -> None:
    summaries = repeated([run(70.0, 500.0, time_scale=50), run(75.0, 540.0, time_scale=25)])
    assert [(s.time_scale, s.runs) for s in summaries] == [(50, 1), (25, 1)]


def test_runs_without_a_band_or_with_different_bands_are_refused() -> None:
    with pytest.raises(PipelineAgreementError, match="no simulated band"):
        repeated([replace(run(70.0, 500.0), band=None)])
    other = replace(run(70.0, 500.0), band=replace(BAND, p99_median_s=400.0))
    with pytest.raises(PipelineAgreementError, match="different simulated bands"):
        repeated([run(70.0, 500.0), other])
