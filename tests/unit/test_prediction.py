"""Service-time predictors as the simulator and the predictor service use them."""

from __future__ import annotations

import math
import random
import statistics
import subprocess
import sys
from collections.abc import Callable

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.prediction import (
    MIN_SERVICE_S,
    ExactServiceTime,
    LinearServiceTimePredictor,
    MlpServiceTimePredictor,
    NoisyPredictor,
    PredictorNotTrainedError,
    ServiceTimeFeatures,
    ServiceTimePredictor,
    UnknownPredictorError,
    make_predictor,
    predictor_names,
)

Law = Callable[[ServiceTimeFeatures], float]
_WORKLOAD_OFFSET_S = {
    WorkloadType.CODE: 0.1,
    WorkloadType.CONVERSATION: 0.4,
    WorkloadType.OTHER: 0.25,
}
_GPU_SPEED = {"a100-80gb": 1.0, "t4": 3.0}


def linear_law(f: ServiceTimeFeatures) -> float:
    """A law the linear model can represent exactly: slower gpus scale every term."""
    prompt_ktok = f.prompt_tokens / 1000
    seconds = 0.2 + 0.5 * prompt_ktok + 0.05 * prompt_ktok**2 + _WORKLOAD_OFFSET_S[f.workload]
    if f.output_tokens_hint is not None:
        seconds += 0.02 * f.output_tokens_hint
    return _GPU_SPEED[f.gpu] * seconds


def nonlinear_law(f: ServiceTimeFeatures) -> float:
    """Square-root growth with a ripple: far from anything a constant can follow."""
    prompt_ktok = f.prompt_tokens / 1000
    workload = {WorkloadType.CODE: 0.6, WorkloadType.CONVERSATION: 1.4, WorkloadType.OTHER: 1.0}
    return _GPU_SPEED[f.gpu] * (
        0.05
        + 0.4 * math.sqrt(prompt_ktok) * workload[f.workload]
        + 0.3 * math.sin(prompt_ktok * 1.25) ** 2
    )


def draw(
    count: int,
    seed: int,
    *,
    gpus: tuple[str, ...] = ("a100-80gb", "t4"),
    hint_share: float = 0.0,
) -> list[ServiceTimeFeatures]:
    rng = random.Random(seed)
    return [
        ServiceTimeFeatures(
            prompt_tokens=rng.randint(16, 6000),
            workload=rng.choice(list(WorkloadType)),
            model="llama-2-7b",
            gpu=rng.choice(gpus),
            output_tokens_hint=rng.randint(1, 500) if rng.random() < hint_share else None,
        )
        for _ in range(count)
    ]


def relative_errors(
    predictor: ServiceTimePredictor, samples: list[ServiceTimeFeatures], law: Law
) -> list[float]:
    return [abs(predictor.predict_s(f) - law(f)) / law(f) for f in samples]


def conversation(prompt_tokens: int, gpu: str = "a100-80gb") -> ServiceTimeFeatures:
    return ServiceTimeFeatures(prompt_tokens, WorkloadType.CONVERSATION, "llama-2-7b", gpu)


# -- the linear model -----------------------------------------------------------------


def test_linear_model_recovers_a_linear_law_within_two_percent() -> None:
    train = draw(2000, seed=1, hint_share=0.3)
    predictor = LinearServiceTimePredictor()
    predictor.fit(train, [linear_law(f) for f in train])

    errors = relative_errors(predictor, draw(500, seed=2, hint_share=0.3), linear_law)

    assert max(errors) < 0.02


def test_linear_model_keeps_one_model_per_gpu() -> None:
    train = draw(2000, seed=3)
    predictor = LinearServiceTimePredictor()
    predictor.fit(train, [linear_law(f) for f in train])

    fast = predictor.predict_s(conversation(2000, "a100-80gb"))
    slow = predictor.predict_s(conversation(2000, "t4"))

    assert set(predictor.keys) == {("llama-2-7b", "a100-80gb"), ("llama-2-7b", "t4")}
    assert slow / fast == pytest.approx(3.0, rel=0.01)


def test_linear_online_updates_follow_a_drift_toward_the_new_truth() -> None:
    train = draw(2000, seed=4)
    predictor = LinearServiceTimePredictor()
    predictor.fit(train, [linear_law(f) for f in train])
    probe = draw(300, seed=5)

    def drifted(f: ServiceTimeFeatures) -> float:
        return 1.5 * linear_law(f)

    before = statistics.mean(relative_errors(predictor, probe, drifted))
    for f in draw(4000, seed=6):
        predictor.update(f, drifted(f))
    after = statistics.mean(relative_errors(predictor, probe, drifted))

    assert before == pytest.approx(1 / 3, rel=0.02)  # predicting the old law: 1/1.5 of truth
    assert after < 0.05


def test_linear_model_stays_bounded_over_a_long_run_without_hints() -> None:
    # No completion ever carries a hint: the hint terms are never excited, which makes
    # plain RLS with forgetting wind up; the regularised form must stay finite and right.
    predictor = LinearServiceTimePredictor(forgetting=0.99)
    for f in draw(6000, seed=7, gpus=("a100-80gb",)):
        predictor.update(f, linear_law(f))

    weights = predictor.coefficients(("llama-2-7b", "a100-80gb"))

    assert all(math.isfinite(w) for w in weights.values())
    assert weights["hint_ktok"] == pytest.approx(0.0, abs=1e-9)
    assert (
        max(relative_errors(predictor, draw(200, seed=8, gpus=("a100-80gb",)), linear_law)) < 0.02
    )


def test_batched_online_updates_equal_single_rls_steps() -> None:
    # Folding eight completions at once must give the very equations eight single
    # steps give: batching is a speed-up, never a different estimator.
    train = draw(500, seed=30)
    single = LinearServiceTimePredictor(forgetting=0.99, solve_every=1)
    batched = LinearServiceTimePredictor(forgetting=0.99, solve_every=8)
    for predictor in (single, batched):
        predictor.fit(train, [linear_law(f) for f in train])
    for f in draw(64, seed=31, gpus=("a100-80gb",)):
        single.update(f, 1.5 * linear_law(f))
        batched.update(f, 1.5 * linear_law(f))

    key = ("llama-2-7b", "a100-80gb")
    expected = single.coefficients(key)
    got = batched.coefficients(key)
    assert expected != predictor_after_fit_only(train, key)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


def predictor_after_fit_only(
    train: list[ServiceTimeFeatures], key: tuple[str, str]
) -> dict[str, float]:
    predictor = LinearServiceTimePredictor()
    predictor.fit(train, [linear_law(f) for f in train])
    return predictor.coefficients(key)


def test_solve_every_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="solve_every"):
        LinearServiceTimePredictor(solve_every=0)


def test_linear_model_learns_from_updates_alone() -> None:
    predictor = LinearServiceTimePredictor()
    for f in draw(300, seed=9):
        predictor.update(f, linear_law(f))

    assert max(relative_errors(predictor, draw(100, seed=10), linear_law)) < 0.05


def test_an_unseen_gpu_falls_back_to_the_global_model() -> None:
    train = draw(1000, seed=11)
    predictor = LinearServiceTimePredictor()
    predictor.fit(train, [linear_law(f) for f in train])

    unseen = predictor.predict_s(conversation(2000, "h100"))

    # The pooled model sits between the fast and the slow worker type.
    fast = predictor.predict_s(conversation(2000, "a100-80gb"))
    slow = predictor.predict_s(conversation(2000, "t4"))
    assert fast < unseen < slow


def test_predicting_before_any_training_says_so() -> None:
    for predictor in (LinearServiceTimePredictor(), MlpServiceTimePredictor()):
        with pytest.raises(PredictorNotTrainedError, match="not been trained"):
            predictor.predict_s(conversation(100))


def test_linear_predictions_never_fall_below_the_floor() -> None:
    # A law that falls with the prompt length extrapolates below zero for long prompts.
    train = draw(500, seed=12, gpus=("a100-80gb",))
    predictor = LinearServiceTimePredictor()
    predictor.fit(train, [2.0 - f.prompt_tokens / 4000 for f in train])

    assert predictor.predict_s(conversation(60_000)) == MIN_SERVICE_S


def test_fit_replaces_what_was_learnt() -> None:
    predictor = LinearServiceTimePredictor()
    first = draw(500, seed=13, gpus=("t4",))
    predictor.fit(first, [linear_law(f) for f in first])
    second = draw(500, seed=14, gpus=("a100-80gb",))
    predictor.fit(second, [linear_law(f) for f in second])

    assert predictor.keys == (("llama-2-7b", "a100-80gb"),)


def test_training_data_errors_name_the_problem() -> None:
    predictor = LinearServiceTimePredictor()
    samples = draw(3, seed=15)
    with pytest.raises(ValueError, match="3 samples and 2 service times"):
        predictor.fit(samples, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"service_s\[1\]"):
        predictor.fit(samples, [1.0, math.nan, 2.0])
    with pytest.raises(ValueError, match="observed_s"):
        predictor.update(samples[0], -1.0)
    with pytest.raises(ValueError, match="prompt_tokens"):
        ServiceTimeFeatures(-1, WorkloadType.CODE, "llama-2-7b", "t4")
    with pytest.raises(ValueError, match="forgetting"):
        LinearServiceTimePredictor(forgetting=1.5)


# -- the MLP ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nonlinear_training() -> tuple[list[ServiceTimeFeatures], list[float]]:
    train = draw(1200, seed=20)
    return train, [nonlinear_law(f) for f in train]


@pytest.fixture(scope="module")
def fitted_mlp(
    nonlinear_training: tuple[list[ServiceTimeFeatures], list[float]],
) -> MlpServiceTimePredictor:
    predictor = MlpServiceTimePredictor(seed=3)
    predictor.fit(*nonlinear_training)
    return predictor


def test_mlp_beats_a_constant_on_a_nonlinear_law(
    fitted_mlp: MlpServiceTimePredictor,
    nonlinear_training: tuple[list[ServiceTimeFeatures], list[float]],
) -> None:
    probe = draw(400, seed=21)
    constant_s = statistics.mean(nonlinear_training[1])
    constant_error = statistics.mean(
        abs(constant_s - nonlinear_law(f)) / nonlinear_law(f) for f in probe
    )

    mlp_error = statistics.mean(relative_errors(fitted_mlp, probe, nonlinear_law))

    assert mlp_error < 0.1
    assert mlp_error < constant_error / 8


def test_mlp_fits_are_deterministic_for_a_seed(
    fitted_mlp: MlpServiceTimePredictor,
    nonlinear_training: tuple[list[ServiceTimeFeatures], list[float]],
) -> None:
    again = MlpServiceTimePredictor(seed=3)
    again.fit(*nonlinear_training)
    other_seed = MlpServiceTimePredictor(seed=4)
    other_seed.fit(*nonlinear_training)
    probe = draw(50, seed=22)

    assert [again.predict_s(f) for f in probe] == [fitted_mlp.predict_s(f) for f in probe]
    assert [other_seed.predict_s(f) for f in probe] != [fitted_mlp.predict_s(f) for f in probe]


def test_mlp_online_updates_change_predictions_toward_a_drift(
    nonlinear_training: tuple[list[ServiceTimeFeatures], list[float]],
) -> None:
    predictor = MlpServiceTimePredictor(seed=5, epochs=60)
    predictor.fit(*nonlinear_training)
    probe = conversation(3000)
    before = predictor.predict_s(probe)

    predictor.update(probe, 2 * nonlinear_law(probe))
    assert predictor.predict_s(probe) != before  # no stale copy of the weights

    for f in draw(600, seed=23):
        predictor.update(f, 2 * nonlinear_law(f))
    assert predictor.predict_s(probe) / nonlinear_law(probe) > 1.5


def test_mlp_answers_for_an_unseen_gpu_from_its_other_slot(
    fitted_mlp: MlpServiceTimePredictor,
) -> None:
    unseen = fitted_mlp.predict_s(conversation(2000, "h100"))

    assert math.isfinite(unseen)
    assert (
        nonlinear_law(conversation(2000)) / 2 < unseen < 2 * nonlinear_law(conversation(2000, "t4"))
    )


def test_mlp_trains_itself_from_enough_completions() -> None:
    predictor = MlpServiceTimePredictor(epochs=20)
    samples = draw(32, seed=24)
    for f in samples[:-1]:
        predictor.update(f, nonlinear_law(f))
    with pytest.raises(PredictorNotTrainedError, match="at least 32 completions"):
        predictor.predict_s(conversation(1000))
    predictor.update(samples[-1], nonlinear_law(samples[-1]))

    assert predictor.predict_s(conversation(1000)) > 0


def test_importing_the_package_does_not_load_torch() -> None:
    code = (
        "import sys, switchyard.prediction as p\n"
        "p.make_predictor('mlp')\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


# -- error injection and the oracle -----------------------------------------------------


def constant_predictor(seconds: float) -> ExactServiceTime:
    return ExactServiceTime(lambda f: seconds)


def test_zero_error_returns_the_inner_prediction_exactly() -> None:
    inner = ExactServiceTime(lambda f: f.prompt_tokens / 997)
    noisy = NoisyPredictor(inner, error=0.0, seed=1)

    assert all(noisy.predict_s(f) == inner.predict_s(f) for f in draw(100, seed=30))


def test_forty_percent_error_has_the_requested_spread_and_is_repeatable() -> None:
    noisy = NoisyPredictor(constant_predictor(2.0), error=0.4, seed=7)
    relative = [noisy.predict_s(conversation(10)) / 2.0 - 1.0 for _ in range(5000)]

    assert statistics.pstdev(relative) == pytest.approx(0.4, rel=0.1)
    assert abs(statistics.mean(relative)) < 0.03
    assert min(relative) >= -0.9
    assert max(relative) <= 3.0
    same_seed = NoisyPredictor(constant_predictor(2.0), error=0.4, seed=7)
    assert [same_seed.predict_s(conversation(10)) / 2.0 - 1.0 for _ in range(5000)] == relative
    other_seed = NoisyPredictor(constant_predictor(2.0), error=0.4, seed=8)
    assert other_seed.predict_s(conversation(10)) != 2.0 * (1 + relative[0])


def test_noisy_predictor_names_itself_and_trains_the_inner_one() -> None:
    inner = LinearServiceTimePredictor()
    noisy = NoisyPredictor(inner, error=0.25, seed=0)
    train = draw(200, seed=31)
    noisy.fit(train, [linear_law(f) for f in train])
    noisy.update(train[0], linear_law(train[0]))

    assert noisy.name == "linear+noise0.25"
    assert inner.keys  # the wrapped predictor learnt
    assert isinstance(noisy, ServiceTimePredictor)


@pytest.mark.parametrize("error", [-0.1, 1.5, math.nan])
def test_error_outside_zero_to_one_is_refused_by_value(error: float) -> None:
    with pytest.raises(ValueError, match=f"got {error}"):
        NoisyPredictor(constant_predictor(1.0), error=error, seed=0)


def test_exact_predictor_returns_the_given_truth_and_learns_nothing() -> None:
    oracle = ExactServiceTime(linear_law)
    oracle.fit([], [])
    oracle.update(conversation(10), 99.0)

    assert oracle.name == "exact"
    assert oracle.predict_s(conversation(1500, "t4")) == linear_law(conversation(1500, "t4"))


# -- the registry -----------------------------------------------------------------------


def test_registry_builds_each_named_predictor() -> None:
    assert predictor_names() == ["linear", "mlp"]
    for name in predictor_names():
        predictor = make_predictor(name, seed=3)
        assert predictor.name == name
        assert isinstance(predictor, ServiceTimePredictor)


def test_unknown_predictor_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPredictorError, match="'forest'; known: linear, mlp") as raised:
        make_predictor("forest")
    assert isinstance(raised.value, ValueError)
    assert "\n" not in str(raised.value)
