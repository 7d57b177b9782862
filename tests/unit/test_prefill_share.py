"""An LLM worker's prefill share (pure): the smoothed share of wall time its prefills
took, as its heartbeat reports it, and what the admission gate makes of it."""

from __future__ import annotations

import math

import pytest
from switchyard.perf.profiles import performance_model

from services.ingress.load_shedding import MAX_PREFILL_SHARE, estimate
from services.worker.backends.prefill_share import PREFILL_SHARE_TAU_S, PrefillShare
from tests.unit.test_ingress_load_shedding import NOW, beat, llm, record


def test_the_first_reading_starts_the_measurement() -> None:
    share = PrefillShare()
    assert share.update(10.0, 5.0, 8.0) == 0.0  # whatever ran before is not counted


def test_the_share_follows_the_prefill_time_over_busy_time() -> None:
    share = PrefillShare()
    share.update(0.0, 0.0, 0.0)
    # Busy 0.8 of every wall second, half of it prefilling, for ten time constants.
    prefill = busy = 0.0
    steps = 10 * int(PREFILL_SHARE_TAU_S)
    for second in range(1, steps + 1):
        prefill, busy = prefill + 0.4, busy + 0.8
        value = share.update(float(second), prefill, busy)
    assert value == pytest.approx(0.5, abs=1e-3)
    # Idle for a time constant: the share falls by 1 - 1/e.
    later = share.update(steps + PREFILL_SHARE_TAU_S, prefill, busy)
    assert later == pytest.approx(value * math.exp(-1.0), rel=1e-6)
    same_time = steps + PREFILL_SHARE_TAU_S
    assert share.update(same_time, prefill, busy) == pytest.approx(later)  # no time, no change


def test_a_reading_holding_more_prefill_than_its_busy_time_counts_as_all_prefill() -> None:
    share = PrefillShare()
    share.update(0.0, 0.0, 0.0)
    weight = 1.0 - math.exp(-1.0 / PREFILL_SHARE_TAU_S)
    assert share.update(1.0, 5.0, 1.0) == pytest.approx(weight)


def test_the_gate_stretches_the_decode_by_the_share_the_worker_reports() -> None:
    perf = performance_model("a100-80gb/llama-2-7b")
    demand = llm()
    decode_s = (demand.output_tokens - 1) * perf.decode_step_s(1, demand.prompt_tokens + 125)
    quiet = estimate(demand, record(beat()), NOW)
    half = estimate(demand, record(beat().model_copy(update={"prefill_share": 0.5})), NOW)
    # A worker prefilling half the time decodes half the time: the decode takes twice as
    # long, its pause counted once (not on top of the batch's own prefills).
    assert half.service_s == pytest.approx(quiet.service_s + decode_s, rel=0.02)
    # A share near 1 is counted as MAX_PREFILL_SHARE: long, but bounded.
    full = estimate(demand, record(beat().model_copy(update={"prefill_share": 1.0})), NOW)
    bounded = MAX_PREFILL_SHARE / (1 - MAX_PREFILL_SHARE)
    assert full.service_s == pytest.approx(quiet.service_s + bounded * decode_s, rel=0.02)
    # So does the rate a full worker drains its backlog at.
    full_batch = beat(running=94, waiting=200, queued_work_s=2000.0)
    busy = estimate(demand, record(full_batch), NOW)
    busy_half = estimate(demand, record(full_batch.model_copy(update={"prefill_share": 0.5})), NOW)
    assert busy_half.wait_s > busy.wait_s * 1.2


def test_a_share_below_the_batchs_own_turnover_changes_nothing() -> None:
    demand = llm()
    full_batch = beat(running=94, waiting=200, queued_work_s=500.0)
    base = estimate(demand, record(full_batch), NOW)
    small = full_batch.model_copy(update={"prefill_share": 0.01})
    assert estimate(demand, record(small), NOW) == base
