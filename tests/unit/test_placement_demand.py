"""The placement service's demand estimate (services.placement.demand): the scheduler's
running stage counts turned into a smoothed rate per wall second."""

from __future__ import annotations

import math

import pytest

from services.placement.demand import DemandRates


def test_a_constant_rate_reads_as_that_rate() -> None:
    demand = DemandRates()
    assert demand.update({"sd15-base": 100}, 0.0, tau_s=5.0) == {}  # the baseline only
    for second in range(1, 6):
        rates = demand.update({"sd15-base": 100 + 4 * second}, float(second), tau_s=5.0)
        # From the first interval on: that one is taken as it is, the next agree with it.
        assert rates == {"sd15-base": pytest.approx(4.0)}


def test_the_rate_follows_a_step_with_the_time_constant() -> None:
    demand = DemandRates()
    demand.update({"m": 0}, 0.0, tau_s=2.0)
    assert demand.update({"m": 0}, 1.0, tau_s=2.0) == {"m": 0.0}  # idle at first
    rates = demand.update({"m": 10}, 2.0, tau_s=2.0)
    # One second of 10 stages/s into an estimate of 0: it moves 1 - exp(-1/2) of the way.
    assert rates["m"] == pytest.approx(10 * (1 - math.exp(-0.5)))
    rates = demand.update({"m": 10}, 4.0, tau_s=2.0)  # then nothing for two seconds
    assert rates["m"] == pytest.approx(10 * (1 - math.exp(-0.5)) * math.exp(-1.0))


def test_irregular_intervals_weigh_by_their_length() -> None:
    """Rounds come late now and then: one long interval counts as the short ones would."""
    steady, late = DemandRates(), DemandRates()
    for demand in (steady, late):
        demand.update({"m": 0}, -1.0, tau_s=3.0)
        demand.update({"m": 2}, 0.0, tau_s=3.0)  # warm at 2 stages/s
    for second in (1, 2, 3, 4):
        steady.update({"m": 2 + 6 * second}, float(second), tau_s=3.0)
    late.update({"m": 26}, 4.0, tau_s=3.0)
    assert late.rates["m"] != pytest.approx(2.0)
    assert late.rates["m"] == pytest.approx(steady.rates["m"])


def test_a_model_first_counted_after_the_baseline_counts_all_its_stages() -> None:
    demand = DemandRates()
    demand.update({"a": 50}, 0.0, tau_s=1.0)
    demand.update({"a": 60}, 1.0, tau_s=1.0)
    rates = demand.update({"a": 60, "b": 8}, 3.0, tau_s=1.0)
    assert rates["a"] == pytest.approx(10 * math.exp(-2.0))
    assert rates["b"] == pytest.approx(4.0 * (1 - math.exp(-2.0)))


def test_counts_that_went_down_are_a_reset_not_a_negative_rate() -> None:
    demand = DemandRates()
    demand.update({"m": 1000}, 0.0, tau_s=1.0)
    demand.update({"m": 1000}, 1.0, tau_s=1.0)
    rates = demand.update({"m": 3}, 2.0, tau_s=1.0)  # the store lost its data
    assert rates["m"] == pytest.approx(3 * (1 - math.exp(-1.0)))


def test_a_model_gone_from_the_counts_decays() -> None:
    demand = DemandRates()
    demand.update({"m": 0}, 0.0, tau_s=1.0)
    assert demand.update({"m": 10}, 1.0, tau_s=1.0)["m"] == pytest.approx(10.0)
    assert demand.update({}, 2.0, tau_s=1.0)["m"] == pytest.approx(10.0 * math.exp(-1.0))


def test_a_read_at_the_same_instant_changes_nothing_and_loses_nothing() -> None:
    demand = DemandRates()
    demand.update({"m": 0}, 0.0, tau_s=1.0)
    before = demand.update({"m": 5}, 1.0, tau_s=1.0)
    assert demand.update({"m": 9}, 1.0, tau_s=1.0) == before
    # The four stages of the ignored read are counted by the next one.
    after = demand.update({"m": 9}, 2.0, tau_s=1.0)["m"]
    assert after == pytest.approx(before["m"] + (1 - math.exp(-1.0)) * (4.0 - before["m"]))


@pytest.mark.parametrize("tau_s", [0.0, -1.0, math.nan, math.inf])
def test_a_bad_time_constant_is_refused_by_name(tau_s: float) -> None:
    with pytest.raises(ValueError, match="tau_s must be a positive number"):
        DemandRates().update({}, 0.0, tau_s=tau_s)
