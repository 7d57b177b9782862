"""Three real classification applications, from the data scikit-learn ships (no download).

=================  =====================  =======  ========  ======================
application        source                 classes  features  default stream mix
=================  =====================  =======  ========  ======================
``fraud-like``     ``load_breast_cancer``  2        30        0.95 / 0.05
``digits``         ``load_digits``         10       64        0.1 each
``wine-dominant``  ``load_wine``           3        13        0.8 / 0.1 / 0.1
=================  =====================  =======  ========  ======================

``fraud-like`` relabels the breast-cancer data so that class 0 is the majority
(``benign``) and class 1 the rare one (``malignant``), as in fraud detection where almost
every transaction is legitimate. In ``wine-dominant`` the first cultivar dominates the
stream.

Each :class:`Dataset` is split 70/30, stratified by class, with the fixed seed
:data:`SPLIT_SEED`; features are standardised with the training split's mean and spread
(a constant column keeps spread 1) and stored as float32, labels as int64. Every model
variant reads these standardised features.

The table above (:data:`DATASET_SPECS`) needs no scikit-learn; :func:`load_dataset`
imports it when called.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DATASET_NAMES",
    "DATASET_SPECS",
    "SPLIT_SEED",
    "TEST_FRACTION",
    "Dataset",
    "DatasetSpec",
    "UnknownDatasetError",
    "check_mix",
    "load_dataset",
    "sample_stream",
]

SPLIT_SEED = 20240601
TEST_FRACTION = 0.3
_MIX_TOLERANCE = 1e-6


class UnknownDatasetError(ValueError):
    """A dataset name that is not one of :data:`DATASET_NAMES`."""


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """What is known about a dataset without loading it.

    Attributes:
        name: the application's dataset name.
        loader: the ``sklearn.datasets`` function that returns the data.
        class_names: one name per label ``0 .. C-1``.
        feature_dim: features per row.
        default_stream_mix: the share of each class in the application's request stream.
        majority_first: relabel a binary dataset so its most frequent class is label 0.
        variants: the model variants the application registers (names of
            ``switchyard.apps.variants.VARIANT_SPECS``), fastest first. Each set is
            chosen so that a faster variant is clearly less accurate on this data (see
            ``docs/benchmarks.md``): the easy datasets need a one-component logistic
            regression for a weak, fast variant, where digits needs four.
    """

    name: str
    loader: str
    class_names: tuple[str, ...]
    feature_dim: int
    default_stream_mix: tuple[float, ...]
    majority_first: bool = False
    variants: tuple[str, ...] = ("logreg-pca4", "mlp-small", "mlp-large")


DATASET_SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="fraud-like",
            loader="load_breast_cancer",
            class_names=("benign", "malignant"),
            feature_dim=30,
            default_stream_mix=(0.95, 0.05),
            majority_first=True,
            variants=("logreg-pca1", "mlp-small", "mlp-large"),
        ),
        DatasetSpec(
            name="digits",
            loader="load_digits",
            class_names=tuple(str(d) for d in range(10)),
            feature_dim=64,
            default_stream_mix=(0.1,) * 10,
        ),
        DatasetSpec(
            name="wine-dominant",
            loader="load_wine",
            class_names=("class_0", "class_1", "class_2"),
            feature_dim=13,
            default_stream_mix=(0.8, 0.1, 0.1),
            variants=("logreg-pca1", "mlp-small", "mlp-large"),
        ),
    )
}
DATASET_NAMES: tuple[str, ...] = tuple(DATASET_SPECS)


@dataclass(frozen=True, kw_only=True, eq=False)
class Dataset:
    """One application's data, split and standardised. The arrays are read-only.

    Attributes:
        name: the dataset name (a key of :data:`DATASET_SPECS`).
        class_names: one name per label.
        x_train, x_test: float32 standardised features, ``[rows, feature_dim]``.
        y_train, y_test: int64 labels in ``0 .. C-1``.
        default_stream_mix: the share of each class in the default request stream.
    """

    name: str
    class_names: tuple[str, ...]
    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    default_stream_mix: tuple[float, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def feature_dim(self) -> int:
        return int(self.x_train.shape[1])


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASET_SPECS[name]
    except KeyError:
        raise UnknownDatasetError(
            f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}"
        ) from None


def _read_only(array: NDArray[np.generic]) -> None:
    array.flags.writeable = False


@functools.cache
def load_dataset(name: str) -> Dataset:
    """Load, relabel, split and standardise one bundled dataset (cached per name).

    Raises:
        UnknownDatasetError: for a name not in :data:`DATASET_NAMES`, listing them.

    Example:
        >>> load_dataset("wine-dominant").x_test.shape
        (54, 13)
    """
    spec = _spec(name)
    from sklearn import datasets as sk_datasets
    from sklearn.model_selection import train_test_split

    bunch = getattr(sk_datasets, spec.loader)()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    if spec.majority_first:
        counts = np.bincount(y, minlength=2)
        if counts[1] > counts[0]:
            y = 1 - y
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED
    )
    mean = x_train.mean(axis=0)
    spread = x_train.std(axis=0)
    spread[spread == 0.0] = 1.0
    dataset = Dataset(
        name=spec.name,
        class_names=spec.class_names,
        x_train=((x_train - mean) / spread).astype(np.float32),
        y_train=np.asarray(y_train, dtype=np.int64),
        x_test=((x_test - mean) / spread).astype(np.float32),
        y_test=np.asarray(y_test, dtype=np.int64),
        default_stream_mix=spec.default_stream_mix,
    )
    for array in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test):
        _read_only(array)
    return dataset


def check_mix(mix: Sequence[float], num_classes: int) -> NDArray[np.float64]:
    """Check a class mix: one finite share per class, each ``>= 0``, summing to 1 (1e-6).

    Returns:
        The mix as a float64 array.

    Raises:
        ValueError: saying which of the rules the mix breaks.
    """
    shares = np.asarray(mix, dtype=np.float64)
    if shares.ndim != 1 or shares.shape[0] != num_classes:
        raise ValueError(f"mix: has {shares.size} values, expected one per class ({num_classes})")
    if not np.all(np.isfinite(shares)) or np.any(shares < 0.0):
        raise ValueError(f"mix: every share must be a finite number >= 0, got {list(mix)}")
    total = float(shares.sum())
    if abs(total - 1.0) > _MIX_TOLERANCE:
        raise ValueError(f"mix: shares must sum to 1 (within 1e-6), got {total!r}")
    return shares


def sample_stream(
    dataset: Dataset, mix: Sequence[float], count: int, rng: np.random.Generator
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Draw ``count`` test-split rows (with replacement) whose labels follow ``mix``.

    Each request's class is drawn from ``mix``, then a test row of that class uniformly:
    the label shares converge on ``mix`` (about ``sqrt(p(1-p)/count)`` off), while every
    row stays a real held-out example.

    Args:
        dataset: where the rows come from (its test split only).
        mix: the share of each class, one per class, summing to 1.
        count: rows to draw, ``>= 0``.
        rng: the only source of randomness.

    Returns:
        ``(features [count, feature_dim] float32, labels [count] int64)``.

    Raises:
        ValueError: for a bad mix or count, or a class with positive share but no test row.
    """
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    shares = check_mix(mix, dataset.num_classes)
    labels = rng.choice(dataset.num_classes, size=count, p=shares / shares.sum()).astype(np.int64)
    rows = np.empty(count, dtype=np.int64)
    for label in range(dataset.num_classes):
        wanted = np.flatnonzero(labels == label)
        if wanted.size == 0:
            continue
        pool = np.flatnonzero(dataset.y_test == label)
        if pool.size == 0:
            raise ValueError(f"mix: class {label} has a share but no test row")
        rows[wanted] = pool[rng.integers(0, pool.size, size=wanted.size)]
    return dataset.x_test[rows].copy(), labels
