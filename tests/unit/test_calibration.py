"""Bias-aware calibration: error averages, calibrated times and adaptive deadlines."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
from switchyard.prediction import (
    CalibrationConfig,
    CalibrationState,
    adaptive_deadline_s,
    calibrated_s,
)


def observe_all(
    pairs: list[tuple[float, float]],
    config: CalibrationConfig,
    state: CalibrationState | None = None,
) -> CalibrationState:
    state = state or CalibrationState()
    for predicted_s, actual_s in pairs:
        state = state.observe(predicted_s, actual_s, config)
    return state


def test_the_worked_example_of_the_formulas() -> None:
    config = CalibrationConfig(beta=1.0, gamma=1.0, eps=0.2)
    state = CalibrationState(mae_s=0.3, mape=0.1, observations=10)

    assert calibrated_s(2.0, state, config) == pytest.approx(2.5)
    assert adaptive_deadline_s(2.0, state, config) == pytest.approx(3.0)


def test_a_fresh_state_leaves_predictions_as_they_are() -> None:
    config = CalibrationConfig()

    assert calibrated_s(2.0, CalibrationState(), config) == 2.0
    assert adaptive_deadline_s(2.0, CalibrationState(), config) == pytest.approx(2.4)


def test_the_first_observation_seeds_the_averages_directly() -> None:
    state = CalibrationState().observe(2.0, 2.5, CalibrationConfig(ema_alpha=0.05))

    assert state.mae_s == pytest.approx(0.5)
    assert state.mape == pytest.approx(0.2)
    assert state.observations == 1


def test_observing_returns_a_new_state_and_leaves_the_old_one() -> None:
    config = CalibrationConfig()
    before = CalibrationState().observe(1.0, 1.2, config)
    after = before.observe(1.0, 3.0, config)

    assert before.mae_s == pytest.approx(0.2)
    assert after.mae_s == pytest.approx(0.2 + 0.05 * (2.0 - 0.2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.mae_s = 0.0  # type: ignore[misc]


def test_a_predictor_biased_low_gets_its_predictions_raised_toward_the_truth() -> None:
    config = CalibrationConfig()
    rng = random.Random(1)
    history = [(p, 1.3 * p) for p in (rng.uniform(0.5, 4.0) for _ in range(300))]
    state = observe_all(history, config)

    predicted = 2.0
    actual = 1.3 * predicted
    calibrated = calibrated_s(predicted, state, config)

    assert calibrated > predicted
    assert abs(calibrated - actual) < abs(predicted - actual)


def test_an_accurate_predictor_is_left_almost_untouched() -> None:
    config = CalibrationConfig()
    state = observe_all([(p, p * 1.001) for p in (1.0, 2.0, 3.0) * 50], config)

    assert calibrated_s(2.0, state, config) == pytest.approx(2.0, rel=0.01)


def test_the_averages_converge_to_the_true_errors() -> None:
    config = CalibrationConfig(ema_alpha=0.01)
    rng = random.Random(2)
    pairs = []
    for _ in range(20_000):
        predicted = rng.uniform(1.0, 3.0)
        pairs.append((predicted, predicted * (1 + rng.uniform(-0.4, 0.4))))
    state = observe_all(pairs, config)

    recent = pairs[-2000:]
    true_mae_s = statistics.mean(abs(a - p) for p, a in recent)
    true_mape = statistics.mean(abs(a - p) / a for p, a in recent)
    assert state.mae_s == pytest.approx(true_mae_s, rel=0.1)
    assert state.mape == pytest.approx(true_mape, rel=0.1)
    assert state.observations == 20_000


def test_a_constant_relative_error_is_tracked_exactly() -> None:
    state = observe_all([(p, 1.3 * p) for p in [2.0] * 100], CalibrationConfig())

    assert state.mape == pytest.approx(0.3 / 1.3)
    assert state.mae_s == pytest.approx(0.6)


def test_the_averages_follow_a_change_in_the_error() -> None:
    config = CalibrationConfig(ema_alpha=0.05)
    state = observe_all([(2.0, 2.2)] * 200, config)
    state = observe_all([(2.0, 3.0)] * 200, config, state)

    assert state.mae_s == pytest.approx(1.0, rel=0.01)


def test_a_non_positive_actual_time_feeds_only_the_absolute_error() -> None:
    config = CalibrationConfig()
    state = CalibrationState().observe(1.0, 0.0, config)
    assert state.mae_s == pytest.approx(1.0)
    assert state.mape == 0.0

    state = state.observe(1.0, 2.0, config)
    assert state.mape == pytest.approx(0.5)  # the first usable one seeds it, no bias to 0


def test_non_finite_times_are_ignored() -> None:
    state = CalibrationState().observe(1.0, 1.5, CalibrationConfig())

    assert state.observe(math.nan, 1.0, CalibrationConfig()) is state
    assert state.observe(1.0, math.inf, CalibrationConfig()) is state


def test_weights_scale_each_margin() -> None:
    state = CalibrationState(mae_s=0.3, mape=0.1, observations=5)

    assert calibrated_s(2.0, state, CalibrationConfig(beta=0.0, gamma=0.0)) == 2.0
    assert calibrated_s(2.0, state, CalibrationConfig(beta=2.0, gamma=0.0)) == pytest.approx(2.6)
    assert calibrated_s(2.0, state, CalibrationConfig(beta=0.0, gamma=3.0)) == pytest.approx(2.6)
    assert adaptive_deadline_s(2.0, state, CalibrationConfig(eps=0.0)) == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("beta", -0.1),
        ("gamma", -1.0),
        ("eps", -0.5),
        ("beta", math.nan),
        ("ema_alpha", 0.0),
        ("ema_alpha", 1.5),
    ],
)
def test_invalid_configuration_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        CalibrationConfig(**{field: value})


def test_an_alpha_of_one_keeps_only_the_latest_error() -> None:
    state = observe_all([(1.0, 2.0), (1.0, 1.5)], CalibrationConfig(ema_alpha=1.0))

    assert state.mae_s == pytest.approx(0.5)
