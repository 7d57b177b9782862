"""SneakPeek: per-request expected accuracy of each model variant, from nearest neighbours.

For a request ``x`` the labels of its ``k`` nearest training rows are multinomial
evidence about the class frequencies near ``x``. With a Dirichlet prior ``alpha``
(:mod:`switchyard.estimation.prior`) the posterior is ``Dir(alpha + counts)`` and its mean

    theta_c = (alpha_c + counts_c) / (sum(alpha) + k)

is SneakPeek's estimate of ``P(class = c | x)``. A variant with per-class recall
``recall_c`` (the profiled ``P(right | class = c)``) is then right on ``x`` with
probability

    E[accuracy] = sum_c theta_c * recall_c

Worked example (2 classes, Jeffreys ``alpha = [0.5, 0.5]``, ``k = 5`` neighbours of which
4 are class 1): ``counts = [1, 4]``, ``theta = [1.5, 4.5] / 6 = [0.25, 0.75]``. A variant
with recalls ``[0.6, 0.9]`` has expected accuracy ``0.25*0.6 + 0.75*0.9 = 0.825`` and one
with recalls ``[0.9, 0.7]`` has ``0.75``; their variance across the two variants is
``((0.825-0.7875)^2 + (0.75-0.7875)^2) / 2 = 0.00140625``. SneakPeek itself, answering
class 1, is right with probability ``max(theta) = 0.75`` (:func:`sneakpeek_accuracy`).

Everything past the neighbour search is vectorised numpy over the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from switchyard.estimation.errors import LabelError, NeighbourCountError, RecallError

__all__ = [
    "CONFIDENCE_THRESHOLD",
    "Estimates",
    "LabelSource",
    "SneakPeekEstimator",
    "class_counts",
    "posterior_theta",
    "sneakpeek_accuracy",
]

CONFIDENCE_THRESHOLD = 0.5
"""An estimate is confident when its largest class frequency exceeds this: the predicted
label is then more likely than all the other classes together."""


class LabelSource(Protocol):
    """What the estimator needs from a neighbour index (:class:`NeighbourIndex` has it)."""

    @property
    def n_rows(self) -> int: ...

    @property
    def num_classes(self) -> int: ...

    def query_labels(self, x: ArrayLike, k: int) -> NDArray[np.int64]: ...


def class_counts(neighbour_labels: ArrayLike, num_classes: int) -> NDArray[np.int64]:
    """Count each class among each request's neighbour labels: ``[m, k]`` -> ``[m, C]``.

    Example: ``class_counts([[1, 1, 0, 1, 1]], 2)`` is ``[[1, 4]]``.
    """
    labels = np.asarray(neighbour_labels, dtype=np.int64)
    if labels.ndim != 2:
        raise LabelError(f"neighbour_labels must be [m, k]; got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise LabelError(
            f"neighbour labels must lie in [0, {num_classes}); "
            f"got {int(labels.min())}..{int(labels.max())}"
        )
    m = labels.shape[0]
    offsets = np.arange(m, dtype=np.int64)[:, None] * num_classes
    flat = np.bincount((labels + offsets).ravel(), minlength=m * num_classes)
    return flat.reshape(m, num_classes)


def posterior_theta(alpha: NDArray[np.float64], counts: NDArray[np.int64]) -> NDArray[np.float64]:
    """Dirichlet-multinomial posterior mean ``(alpha + counts) / (sum(alpha) + k)``, ``[m, C]``.

    ``k`` is each row's total count. Example: ``alpha = [0.5, 0.5]``,
    ``counts = [[1, 4]]`` -> ``[[0.25, 0.75]]``.
    """
    posterior = counts + alpha[None, :]
    result: NDArray[np.float64] = posterior / posterior.sum(axis=1, keepdims=True)
    return result


def sneakpeek_accuracy(theta: ArrayLike) -> NDArray[np.float64]:
    """Expected accuracy of answering with SneakPeek's own predicted label: ``max_c theta_c``.

    Short-circuit inference treats the estimate as a zero-latency candidate model that
    answers ``argmax theta``. If the class frequencies near the request are ``theta``,
    the true class is ``c`` with probability ``theta_c``, so answering the argmax is right
    with probability ``max theta`` (and no other fixed answer does better).

    Args:
        theta: posterior class frequencies, ``[m, C]`` (or ``[C]`` for one request).

    Returns:
        ``[m]`` (or a 0-d array for ``[C]``). Example: ``[[0.25, 0.75]]`` -> ``[0.75]``.
    """
    result: NDArray[np.float64] = np.asarray(theta, dtype=np.float64).max(axis=-1)
    return result


@dataclass(frozen=True, slots=True)
class Estimates:
    """SneakPeek's estimates for a batch of ``m`` requests over ``C`` classes.

    Attributes:
        theta: posterior mean class frequencies, float64 ``[m, C]``; rows sum to 1.
        expected_accuracy: variant name -> expected accuracy of each request, ``[m]``.
        predicted_label: ``argmax theta`` per request (lowest class on ties), ``[m]``.
        confident: ``max theta > 0.5`` per request, ``[m]``.
        accuracy_variance: population variance (``ddof=0``) of the expected accuracies
            across variants, per request, ``[m]`` (0 with one variant); the ``Var[acc]``
            of the scheduling priority ``(1 + Var[acc]) * exp(-d)``.
    """

    theta: NDArray[np.float64]
    expected_accuracy: Mapping[str, NDArray[np.float64]]
    predicted_label: NDArray[np.int64]
    confident: NDArray[np.bool_]
    accuracy_variance: NDArray[np.float64]

    @property
    def sneakpeek_accuracy(self) -> NDArray[np.float64]:
        """Expected accuracy of the short-circuit answer ``predicted_label``: ``max theta``."""
        return sneakpeek_accuracy(self.theta)

    def __len__(self) -> int:
        return int(self.theta.shape[0])


class SneakPeekEstimator:
    """Posterior class frequencies and per-variant expected accuracies of requests.

    Args:
        index: the neighbour index over the application's training data.
        alpha: Dirichlet prior, ``[C]`` (:func:`~switchyard.estimation.prior.dirichlet_alpha`),
            finite, non-negative, positive sum; ``C`` must cover every training label.
        recalls: variant name -> per-class recall ``[C]`` in ``[0, 1]``; at least one.
        k: neighbours per request, ``1 <= k <= index.n_rows``.

    Raises:
        ValueError: a bad ``alpha`` (named); :class:`LabelError` when training labels
            exceed ``C``; :class:`RecallError`; :class:`NeighbourCountError`.
    """

    __slots__ = ("_alpha", "_index", "_k", "_recall_matrix", "_variants")

    def __init__(
        self,
        index: LabelSource,
        alpha: ArrayLike,
        recalls: Mapping[str, ArrayLike],
        k: int = 5,
    ) -> None:
        alpha_array = np.array(alpha, dtype=np.float64)
        if alpha_array.ndim != 1 or alpha_array.shape[0] < 1:
            raise ValueError(f"alpha must be a non-empty 1-D array; got shape {alpha_array.shape}")
        if not np.all(np.isfinite(alpha_array)) or np.any(alpha_array < 0):
            raise ValueError("alpha must hold finite, non-negative pseudo-counts")
        if alpha_array.sum() <= 0:
            raise ValueError("alpha must have a positive sum")
        num_classes = alpha_array.shape[0]
        if index.num_classes > num_classes:
            raise LabelError(
                f"the index has labels up to {index.num_classes - 1} but alpha has only "
                f"{num_classes} classes"
            )
        if not recalls:
            raise RecallError("recalls must name at least one variant")
        columns = []
        for name, recall in recalls.items():
            values = np.asarray(recall, dtype=np.float64)
            if values.shape != (num_classes,):
                raise RecallError(
                    f"recalls of variant {name!r} must have shape ({num_classes},); "
                    f"got {values.shape}"
                )
            if not np.all(np.isfinite(values)) or np.any((values < 0) | (values > 1)):
                raise RecallError(f"recalls of variant {name!r} must lie in [0, 1]")
            columns.append(values)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= index.n_rows:
            raise NeighbourCountError(
                f"k must be between 1 and the number of training rows ({index.n_rows}); got {k!r}"
            )
        alpha_array.setflags(write=False)
        self._index = index
        self._alpha = alpha_array
        self._k = k
        self._variants = tuple(recalls)
        self._recall_matrix = np.stack(columns, axis=1)  # [C, V]

    @property
    def k(self) -> int:
        """Neighbours per request."""
        return self._k

    @property
    def alpha(self) -> NDArray[np.float64]:
        """The Dirichlet prior, ``[C]`` (read-only)."""
        return self._alpha

    @property
    def variants(self) -> tuple[str, ...]:
        """Variant names, in the order ``recalls`` gave them."""
        return self._variants

    def estimate(self, x: ArrayLike) -> Estimates:
        """Estimates for the requests ``x`` (``[m, d]``); see the module docstring."""
        return self.estimate_from_labels(self._index.query_labels(x, self._k))

    def estimate_from_labels(self, neighbour_labels: ArrayLike) -> Estimates:
        """Estimates from already-found neighbour labels, ``[m, k]`` (any ``k``; 0 gives the prior mean).

        Example: ``alpha = [0.5, 0.5]`` and labels ``[[1, 1, 0, 1, 1]]`` give
        ``theta = [[0.25, 0.75]]``, ``predicted_label = [1]``, ``confident = [True]``.
        """
        counts = class_counts(neighbour_labels, self._alpha.shape[0])
        theta = posterior_theta(self._alpha, counts)
        accuracy = theta @ self._recall_matrix  # [m, V]
        expected = {name: accuracy[:, j] for j, name in enumerate(self._variants)}
        best = theta.max(axis=1)
        return Estimates(
            theta=theta,
            expected_accuracy=MappingProxyType(expected),
            predicted_label=theta.argmax(axis=1).astype(np.int64),
            confident=best > CONFIDENCE_THRESHOLD,
            accuracy_variance=accuracy.var(axis=1),
        )
