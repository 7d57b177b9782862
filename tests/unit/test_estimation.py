"""SneakPeek: priors, the neighbour index, per-request expected accuracy and its quality."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import recall_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from switchyard.estimation import (
    AccuracyMae,
    EmptyTrainingSetError,
    FeatureDimensionError,
    LabelError,
    NeighbourCountError,
    NeighbourIndex,
    NonFiniteFeatureError,
    RecallError,
    SneakPeekEstimator,
    UnknownIndexKindError,
    accuracy_mae,
    class_counts,
    default_nlist,
    dirichlet_alpha,
    posterior_theta,
    sneakpeek_accuracy,
)

Floats = NDArray[np.float64]


def two_cluster_index(kind: str = "flat") -> NeighbourIndex:
    """Five training rows: one of class 0 and four of class 1."""
    features = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.5, 0.5]])
    return NeighbourIndex.build(features, np.array([0, 1, 1, 1, 1]), kind)


# -- priors ------------------------------------------------------------------------------


def test_jeffreys_prior_is_one_half_per_class() -> None:
    assert dirichlet_alpha("jeffreys", [0.2, 0.3, 0.5]).tolist() == [0.5, 0.5, 0.5]


def test_weak_prior_is_centred_on_training_frequencies_with_one_pseudo_count_per_class() -> None:
    alpha = dirichlet_alpha("weak", [0.2, 0.8])
    np.testing.assert_allclose(alpha, [0.4, 1.6])
    np.testing.assert_allclose(dirichlet_alpha("weak", [0.2, 0.8], concentration=10), [2, 8])


def test_strong_prior_has_concentration_100_unless_given() -> None:
    np.testing.assert_allclose(dirichlet_alpha("strong", [0.2, 0.8]), [20, 80])
    np.testing.assert_allclose(dirichlet_alpha("strong", [0.25, 0.75], 1000), [250, 750])


def test_a_strong_prior_holds_theta_near_the_training_frequencies() -> None:
    counts = np.array([[5, 0]])
    jeffreys = posterior_theta(dirichlet_alpha("jeffreys", [0.2, 0.8]), counts)
    strong = posterior_theta(dirichlet_alpha("strong", [0.2, 0.8]), counts)
    assert jeffreys[0, 0] > 0.9
    assert strong[0, 0] == pytest.approx(25 / 105)


@pytest.mark.parametrize(
    ("kind", "frequencies", "concentration", "argument", "problem"),
    [
        ("uniform", [0.5, 0.5], None, "kind", "one of jeffreys, weak, strong"),
        ("weak", [-0.1, 1.1], None, "class_frequencies", "non-negative"),
        ("weak", [0.5, 0.6], None, "class_frequencies", "sum to 1"),
        ("weak", [], None, "class_frequencies", "non-empty"),
        ("weak", [[0.5, 0.5]], None, "class_frequencies", "1-D"),
        ("weak", [float("nan"), 1.0], None, "class_frequencies", "finite"),
        ("strong", [0.5, 0.5], 0.0, "concentration", "> 0"),
        ("strong", [0.5, 0.5], -3.0, "concentration", "> 0"),
        ("weak", [0.5, 0.5], float("inf"), "concentration", "finite"),
        ("jeffreys", [0.5, 0.5], 2.0, "concentration", "only to the weak and strong"),
    ],
)
def test_bad_priors_name_their_argument(
    kind: str, frequencies: Any, concentration: float | None, argument: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)) as raised:
        dirichlet_alpha(kind, frequencies, concentration)
    assert argument in str(raised.value)


def test_frequencies_within_one_millionth_of_one_are_accepted() -> None:
    assert dirichlet_alpha("weak", [0.3333333, 0.3333333, 0.3333333]).shape == (3,)


# -- the posterior and expected accuracy ---------------------------------------------------


def test_worked_dirichlet_example_from_neighbour_labels() -> None:
    alpha = dirichlet_alpha("jeffreys", [0.5, 0.5])
    counts = class_counts([[1, 1, 0, 1, 1]], 2)
    assert counts.tolist() == [[1, 4]]
    theta = posterior_theta(alpha, counts)
    np.testing.assert_allclose(theta, [[(0.5 + 1) / 6, (0.5 + 4) / 6]])


def test_worked_dirichlet_example_through_an_index() -> None:
    estimator = SneakPeekEstimator(
        two_cluster_index(),
        dirichlet_alpha("jeffreys", [0.5, 0.5]),
        {"small": [0.6, 0.9], "large": [0.9, 0.7]},
        k=5,
    )
    estimates = estimator.estimate([[0.4, 0.4]])
    np.testing.assert_allclose(estimates.theta, [[0.25, 0.75]])
    np.testing.assert_allclose(estimates.expected_accuracy["small"], [0.25 * 0.6 + 0.75 * 0.9])
    np.testing.assert_allclose(estimates.expected_accuracy["large"], [0.25 * 0.9 + 0.75 * 0.7])
    np.testing.assert_allclose(estimates.accuracy_variance, [0.0375**2])
    assert estimates.predicted_label.tolist() == [1]
    assert estimates.confident.tolist() == [True]
    np.testing.assert_allclose(estimates.sneakpeek_accuracy, [0.75])
    assert len(estimates) == 1
    assert list(estimates.expected_accuracy) == ["small", "large"]


def test_an_evenly_split_neighbourhood_is_not_confident() -> None:
    alpha = dirichlet_alpha("jeffreys", [1 / 3, 1 / 3, 1 / 3])
    index = NeighbourIndex.build(np.eye(3), [0, 1, 2])
    estimates = SneakPeekEstimator(index, alpha, {"only": [1, 1, 1]}, k=2).estimate_from_labels(
        [[0, 1], [2, 2]]
    )
    assert estimates.confident.tolist() == [False, True]
    np.testing.assert_allclose(estimates.theta.sum(axis=1), [1, 1])
    np.testing.assert_allclose(estimates.accuracy_variance, [0, 0])  # one variant
    np.testing.assert_allclose(estimates.expected_accuracy["only"], [1, 1])


def test_sneakpeek_accuracy_is_the_largest_class_frequency() -> None:
    np.testing.assert_allclose(sneakpeek_accuracy([[0.25, 0.75], [0.6, 0.4]]), [0.75, 0.6])


def test_an_empty_batch_gives_empty_estimates() -> None:
    estimator = SneakPeekEstimator(two_cluster_index(), [0.5, 0.5], {"v": [1, 1]}, k=3)
    estimates = estimator.estimate(np.empty((0, 2)))
    assert estimates.theta.shape == (0, 2)
    assert estimates.expected_accuracy["v"].shape == (0,)


# -- quality -------------------------------------------------------------------------------


def test_accuracy_mae_worked_example() -> None:
    result = accuracy_mae({"v": [1, 1, 1, 0]}, {"v": 0.9}, {"v": np.array([0.95, 0.9, 0.95, 0.4])})
    assert result["v"].profiled_mae == pytest.approx(0.3)
    assert result["v"].sneakpeek_mae == pytest.approx(0.15)
    assert result["v"].observed_accuracy == pytest.approx(0.75)
    assert result["v"].improvement == pytest.approx(0.15)


@pytest.mark.parametrize(
    ("outcomes", "profiled", "expected", "names"),
    [
        ({"v": [1, 0]}, {}, {"v": [0.5, 0.5]}, "profiled_accuracy"),
        ({"v": [1, 0]}, {"v": 0.5}, {}, "expected_accuracy"),
        ({"v": [1, 0.5]}, {"v": 0.5}, {"v": [0.5, 0.5]}, "0 or 1"),
        ({"v": [1, 0]}, {"v": 0.5}, {"v": [0.5]}, "shape"),
        ({"v": [1, 0]}, {"v": 1.5}, {"v": [0.5, 0.5]}, "profiled_accuracy"),
        ({"v": [1, 0]}, {"v": 0.5}, {"v": [0.5, 2.0]}, "expected_accuracy"),
        ({"v": []}, {"v": 0.5}, {"v": []}, "no requests"),
    ],
)
def test_accuracy_mae_rejects_bad_inputs(
    outcomes: Any, profiled: Any, expected: Any, names: str
) -> None:
    with pytest.raises(ValueError, match=names):
        accuracy_mae(outcomes, profiled, expected)


# -- real data: digits -----------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    train_x: NDArray[np.float32]
    train_y: NDArray[np.int64]
    test_x: NDArray[np.float32]
    test_y: NDArray[np.int64]


@pytest.fixture(scope="module")
def digits() -> Split:
    x, y = load_digits(return_X_y=True)
    train_x, test_x, train_y, test_y = train_test_split(
        x, y, test_size=0.3, stratify=y, random_state=0
    )
    scaler = StandardScaler().fit(train_x)
    return Split(
        scaler.transform(train_x).astype(np.float32),
        train_y.astype(np.int64),
        scaler.transform(test_x).astype(np.float32),
        test_y.astype(np.int64),
    )


def test_flat_neighbours_vote_the_true_digit_for_most_test_rows(digits: Split) -> None:
    index = NeighbourIndex.build(digits.train_x, digits.train_y, "flat")
    frequencies = np.bincount(digits.train_y, minlength=10) / digits.train_y.shape[0]
    estimator = SneakPeekEstimator(
        index, dirichlet_alpha("jeffreys", frequencies), {"any": np.ones(10)}, k=5
    )
    estimates = estimator.estimate(digits.test_x)
    vote_accuracy = float((estimates.predicted_label == digits.test_y).mean())
    assert vote_accuracy >= 0.93, vote_accuracy
    # Jeffreys over 10 classes is 5 pseudo-counts, as many as k: even 5 unanimous
    # neighbours give max theta = (0.5 + 5) / (5 + 5), so the short-circuit estimate is
    # conservative there.
    assert float(estimates.sneakpeek_accuracy.max()) == pytest.approx(0.55)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_indexes_agree_with_the_exact_one(digits: Split, kind: str) -> None:
    exact = NeighbourIndex.build(digits.train_x, digits.train_y, "flat")
    approximate = NeighbourIndex.build(digits.train_x, digits.train_y, kind, seed=1)
    exact_labels = np.sort(exact.query_labels(digits.test_x, 5), axis=1)
    approximate_labels = np.sort(approximate.query_labels(digits.test_x, 5), axis=1)
    assert float((exact_labels == approximate_labels).mean()) >= 0.95


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_the_same_seed_gives_the_same_neighbours(digits: Split, kind: str) -> None:
    first = NeighbourIndex.build(digits.train_x, digits.train_y, kind, seed=7)
    second = NeighbourIndex.build(digits.train_x, digits.train_y, kind, seed=7)
    np.testing.assert_array_equal(
        first.neighbour_rows(digits.test_x, 5), second.neighbour_rows(digits.test_x, 5)
    )


def test_ivf_defaults_and_a_full_search_when_probed_cells_are_short() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(60, 4)).astype(np.float32)
    labels = np.arange(60) % 3
    assert default_nlist(1500) == 39
    assert default_nlist(1) == 1
    ivf = NeighbourIndex.build(features, labels, "ivf", nlist=30, nprobe=1, seed=0)
    assert (ivf.nlist, ivf.nprobe) == (30, 1)
    exact = NeighbourIndex.build(features, labels, "flat")
    queries = rng.normal(size=(10, 4))
    np.testing.assert_array_equal(
        np.sort(ivf.neighbour_rows(queries, 20), axis=1),
        np.sort(exact.neighbour_rows(queries, 20), axis=1),
    )
    tiny = NeighbourIndex.build(features[:3], labels[:3], "ivf", nlist=50)
    assert tiny.nlist == 3


# -- real data: an imbalanced binary stream (breast cancer) ---------------------------------


def test_sneakpeek_tracks_outcomes_better_than_profiled_accuracy() -> None:
    x, y = load_breast_cancer(return_X_y=True)
    train_x, rest_x, train_y, rest_y = train_test_split(
        x, y, test_size=0.5, stratify=y, random_state=0
    )
    profile_x, pool_x, profile_y, pool_y = train_test_split(
        rest_x, rest_y, test_size=0.5, stratify=rest_y, random_state=0
    )
    scaler = StandardScaler().fit(train_x)
    train_z, profile_z, pool_z = (scaler.transform(a) for a in (train_x, profile_x, pool_x))
    # Two variants: every feature, and a weak one on two features (texture, fractal dim).
    columns: dict[str, list[int]] = {"logreg": list(range(30)), "logreg-2f": [1, 9]}
    models = {
        name: LogisticRegression(max_iter=5000).fit(train_z[:, cols], train_y)
        for name, cols in columns.items()
    }
    recalls: dict[str, Floats] = {}
    profiled: dict[str, float] = {}
    for name, model in models.items():
        predicted = model.predict(profile_z[:, columns[name]])
        recalls[name] = np.asarray(recall_score(profile_y, predicted, average=None))
        profiled[name] = float((predicted == profile_y).mean())

    # The stream: every benign row of the pool and 10 malignant ones (90 % benign).
    rng = np.random.default_rng(0)
    malignant = rng.choice(np.flatnonzero(pool_y == 0), size=10, replace=False)
    stream = np.concatenate([np.flatnonzero(pool_y == 1), malignant])
    stream_z, stream_y = pool_z[stream], pool_y[stream]
    assert float(stream_y.mean()) == pytest.approx(0.9)

    frequencies = np.bincount(train_y, minlength=2) / train_y.shape[0]
    index = NeighbourIndex.build(train_z.astype(np.float32), train_y, "flat")
    estimator = SneakPeekEstimator(index, dirichlet_alpha("jeffreys", frequencies), recalls, k=5)
    estimates = estimator.estimate(stream_z)
    outcomes = {
        name: (model.predict(stream_z[:, columns[name]]) == stream_y).astype(int)
        for name, model in models.items()
    }
    result = accuracy_mae(outcomes, profiled, estimates.expected_accuracy)

    for name, quality in result.items():
        assert isinstance(quality, AccuracyMae)
        assert quality.n_requests == 100
        assert quality.sneakpeek_mae < quality.profiled_mae, (name, quality)
    weak = result["logreg-2f"]
    assert weak.sneakpeek_mae < 0.85 * weak.profiled_mae, weak


# -- bad inputs --------------------------------------------------------------------------------


def test_wrong_feature_dimension_names_expected_and_got() -> None:
    index = two_cluster_index()
    with pytest.raises(FeatureDimensionError, match=r"expected 2, got 3"):
        index.query_labels(np.zeros((1, 3)), 1)
    with pytest.raises(FeatureDimensionError, match="2-D"):
        index.query_labels(np.zeros(2), 1)
    with pytest.raises(FeatureDimensionError, match="2-D"):
        NeighbourIndex.build(np.zeros(5), np.zeros(5, dtype=int))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_features_name_the_row(bad: float) -> None:
    features = np.zeros((4, 2))
    features[2, 1] = bad
    with pytest.raises(NonFiniteFeatureError, match="row 2"):
        NeighbourIndex.build(features, [0, 1, 0, 1])
    queries = np.zeros((3, 2))
    queries[1, 0] = bad
    with pytest.raises(NonFiniteFeatureError, match="x row 1"):
        two_cluster_index().query_labels(queries, 1)


@pytest.mark.parametrize("k", [0, -1, 6])
def test_k_outside_one_to_n_is_refused(k: int) -> None:
    with pytest.raises(
        NeighbourCountError, match=r"between 1 and the number of training rows \(5\)"
    ):
        two_cluster_index().query_labels(np.zeros((1, 2)), k)
    with pytest.raises(NeighbourCountError):
        SneakPeekEstimator(two_cluster_index(), [0.5, 0.5], {"v": [1, 1]}, k=k)


def test_an_empty_training_set_is_refused() -> None:
    with pytest.raises(EmptyTrainingSetError, match="empty"):
        NeighbourIndex.build(np.empty((0, 4)), np.empty(0, dtype=int))
    with pytest.raises(EmptyTrainingSetError, match="empty"):
        NeighbourIndex.build(np.empty((3, 0)), [0, 1, 2])


def test_unknown_index_kind_is_refused() -> None:
    with pytest.raises(UnknownIndexKindError, match="flat, ivf, hnsw"):
        NeighbourIndex.build(np.eye(2), [0, 1], "lsh")


@pytest.mark.parametrize(
    ("labels", "names"),
    [
        ([0, 1], "one label per training row"),
        ([0, -1, 1], "non-negative"),
        ([0.0, 1, 1], "integers"),
    ],
)
def test_bad_labels_are_refused(labels: list[float], names: str) -> None:
    with pytest.raises(LabelError, match=names):
        NeighbourIndex.build(np.eye(3), labels)


def test_estimator_checks_classes_and_recalls() -> None:
    index = NeighbourIndex.build(np.eye(3), [0, 1, 2])
    with pytest.raises(LabelError, match="labels up to 2"):
        SneakPeekEstimator(index, [0.5, 0.5], {"v": [1, 1]}, k=1)
    with pytest.raises(RecallError, match="shape"):
        SneakPeekEstimator(index, [0.5] * 3, {"v": [1, 1]}, k=1)
    with pytest.raises(RecallError, match=r"\[0, 1\]"):
        SneakPeekEstimator(index, [0.5] * 3, {"v": [1, 1, 1.2]}, k=1)
    with pytest.raises(RecallError, match="at least one variant"):
        SneakPeekEstimator(index, [0.5] * 3, {}, k=1)
    with pytest.raises(ValueError, match="alpha"):
        SneakPeekEstimator(index, [0.5, -0.5, 1], {"v": [1, 1, 1]}, k=1)
    with pytest.raises(ValueError, match="alpha"):
        SneakPeekEstimator(index, [0.0, 0.0, 0.0], {"v": [1, 1, 1]}, k=1)


def test_every_sneakpeek_error_is_a_value_error() -> None:
    for error in (
        EmptyTrainingSetError,
        FeatureDimensionError,
        LabelError,
        NeighbourCountError,
        NonFiniteFeatureError,
        RecallError,
        UnknownIndexKindError,
    ):
        assert issubclass(error, ValueError)


def test_importing_the_package_does_not_load_faiss() -> None:
    code = (
        "import sys, numpy as np, switchyard.estimation as sp\n"
        "sp.dirichlet_alpha('weak', [0.5, 0.5])\n"
        "sp.posterior_theta(np.array([0.5, 0.5]), np.array([[1, 4]]))\n"
        "print('faiss' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"
