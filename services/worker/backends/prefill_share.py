"""An LLM worker's recent share of time spent prefilling, as its heartbeat reports it.

A prompt's prefill pauses (or, chunked, slows) the decode of every request running
beside it, so a request's time to finish depends on how often newcomers arrive, not
only on how many run with it. The admission gate's batch model counts a batch's own
turnover (:mod:`services.ingress.load_shedding`); a stream of short requests (a
verifier's one-token verdicts) brings many more prompts than that, and only the worker
sees them. :class:`PrefillShare` smooths the share of its busy time its prefills took
into one number per heartbeat.
"""

from __future__ import annotations

import math

__all__ = ["PREFILL_SHARE_TAU_S", "PrefillShare"]

PREFILL_SHARE_TAU_S = 1.0
"""The smoothing time constant, wall seconds: a few heartbeats, so one burst of prompts
neither vanishes between two heartbeats nor lingers for long."""


class PrefillShare:
    """The exponentially smoothed share of an engine's busy time spent prefilling, from
    running totals read at arbitrary times.

    Busy time, not wall time: an idle engine delays no one, and an emulated engine's
    iterations can take longer in wall time than their modelled length (the event loop
    is busy elsewhere), which would dilute a share of wall time. The smoothing runs on
    wall time, so a share fades within a few time constants once the engine is idle."""

    __slots__ = ("_last", "share")

    def __init__(self) -> None:
        self.share = 0.0
        self._last: tuple[float, float, float] | None = None

    def update(self, now_s: float, prefill_total_s: float, busy_total_s: float) -> float:
        """The share at ``now_s`` (monotonic wall seconds), given the seconds of prefill
        begun and of busy time spent in all by then (both on the engine's own clock);
        the first reading only starts the measurement."""
        last = self._last
        self._last = (now_s, prefill_total_s, busy_total_s)
        if last is None:
            return self.share
        elapsed_s = now_s - last[0]
        if elapsed_s <= 0:
            return self.share
        busy_s = busy_total_s - last[2]
        # A prefill is counted when it begins, so one reading may hold more than its span.
        recent = min(1.0, max(0.0, (prefill_total_s - last[1]) / busy_s)) if busy_s > 0 else 0.0
        weight = 1.0 - math.exp(-elapsed_s / PREFILL_SHARE_TAU_S)
        self.share += weight * (recent - self.share)
        return self.share
