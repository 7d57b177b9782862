"""Several live replays of one pipeline slice against the simulator's jittered band.

What the adaptive placement decides hangs on timing (:mod:`research.multimodel.agreement`):
one replay, live or simulated, is one draw of decisions that a tenth of a model second
can flip, and the slice's P99 moves by a factor of 1.7 between draws. So one live run
against the deterministic simulation compares two draws. :func:`repeated` compares the
distributions instead: the median of the live runs' P50 and P99 against the median of
the simulator's under arrival jitter of the live control plane's size
(:func:`~research.multimodel.agreement.sim_band`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.stats import quantile

from research.multimodel.agreement import (
    DEFAULT_TOLERANCE,
    PipelineAgreement,
    PipelineAgreementError,
    SimBand,
)

__all__ = ["RepeatedAgreement", "repeated"]


@dataclass(frozen=True, slots=True)
class RepeatedAgreement:
    """The live runs at one time scale and placement rate against the simulator's band:
    medians in model seconds, ratios live over simulated."""

    time_scale: float
    update_hz: float
    runs: int
    live_p50_median_s: float
    live_p99_median_s: float
    band: SimBand

    @property
    def p50_ratio(self) -> float:
        return self.live_p50_median_s / self.band.p50_median_s

    @property
    def p99_ratio(self) -> float:
        return self.live_p99_median_s / self.band.p99_median_s

    def within(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        """Whether the medians' P50 and P99 both agree within ``tolerance``."""
        return abs(self.p50_ratio - 1) <= tolerance and abs(self.p99_ratio - 1) <= tolerance


def repeated(agreements: Sequence[PipelineAgreement]) -> list[RepeatedAgreement]:
    """One :class:`RepeatedAgreement` per (time scale, placement rate) of ``agreements``,
    in the order first met.

    Raises:
        PipelineAgreementError: an agreement without its band, or runs of one setting
            with different bands (not the same slice and simulation).
    """
    by_setting: dict[tuple[float, float], list[PipelineAgreement]] = {}
    for agreement in agreements:
        if agreement.band is None:
            raise PipelineAgreementError(
                f"the run at T {agreement.time_scale:g} has no simulated band to compare with"
            )
        by_setting.setdefault((agreement.time_scale, agreement.update_hz), []).append(agreement)
    summaries = []
    for (scale, rate), runs in by_setting.items():
        band = runs[0].band
        assert band is not None
        if any(run.band != band for run in runs):
            raise PipelineAgreementError(
                f"the runs at T {scale:g} were compared with different simulated bands"
            )
        summaries.append(
            RepeatedAgreement(
                time_scale=scale,
                update_hz=rate,
                runs=len(runs),
                live_p50_median_s=quantile([run.live_p50_s for run in runs], 0.5),
                live_p99_median_s=quantile([run.live_p99_s for run in runs], 0.5),
                band=band,
            )
        )
    return summaries
