"""How well SneakPeek's per-request accuracy estimates track what actually happened.

For every request and variant the truth is an outcome: 1 if the variant's prediction was
right, else 0. Two estimates of it are compared by their mean absolute error:

* the profiled accuracy: one constant per variant (its accuracy on a profiling set),
  blind to the request;
* the SneakPeek expected accuracy ``sum_c theta_c * recall_c``, one value per request.

Worked example: one variant right on 3 of 4 requests (outcomes ``[1, 1, 1, 0]``), profiled
accuracy ``0.9``, SneakPeek estimates ``[0.95, 0.9, 0.95, 0.4]``. Profiled MAE =
``(0.1 + 0.1 + 0.1 + 0.9) / 4 = 0.3``; SneakPeek MAE = ``(0.05 + 0.1 + 0.05 + 0.4) / 4
= 0.15``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["AccuracyMae", "accuracy_mae"]


@dataclass(frozen=True, slots=True)
class AccuracyMae:
    """Mean absolute errors of one variant's accuracy estimates over ``n_requests``.

    Attributes:
        profiled_mae: ``mean |outcome - profiled accuracy|``.
        sneakpeek_mae: ``mean |outcome - SneakPeek expected accuracy|``.
        observed_accuracy: ``mean outcome``, the variant's accuracy on these requests.
        n_requests: number of requests compared.
    """

    profiled_mae: float
    sneakpeek_mae: float
    observed_accuracy: float
    n_requests: int

    @property
    def improvement(self) -> float:
        """``profiled_mae - sneakpeek_mae``: positive when SneakPeek is the better estimate."""
        return self.profiled_mae - self.sneakpeek_mae


def _vector(values: ArrayLike, name: str, variant: str) -> NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} of variant {variant!r} must be 1-D; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} of variant {variant!r} must be finite")
    return array


def accuracy_mae(
    outcomes: Mapping[str, ArrayLike],
    profiled_accuracy: Mapping[str, float],
    expected_accuracy: Mapping[str, ArrayLike],
) -> dict[str, AccuracyMae]:
    """Compare profiled and SneakPeek accuracy estimates against outcomes, per variant.

    Args:
        outcomes: variant -> ``[m]`` of 0/1 (1 when the variant was right on the request).
        profiled_accuracy: variant -> its profiled accuracy, in ``[0, 1]``.
        expected_accuracy: variant -> SneakPeek's ``[m]`` expected accuracies
            (``Estimates.expected_accuracy``), in ``[0, 1]``.

    Returns:
        variant -> :class:`AccuracyMae`, for every variant of ``outcomes``.

    Raises:
        ValueError: a variant missing from ``profiled_accuracy`` or ``expected_accuracy``,
            no requests, shapes that differ, outcomes other than 0/1, or estimates
            outside ``[0, 1]``; the message names the variant and the argument.

    Example: see the module docstring (profiled MAE 0.3, SneakPeek MAE 0.15).
    """
    if not outcomes:
        raise ValueError("outcomes must name at least one variant")
    result: dict[str, AccuracyMae] = {}
    for variant, raw in outcomes.items():
        if variant not in profiled_accuracy:
            raise ValueError(f"profiled_accuracy has no entry for variant {variant!r}")
        if variant not in expected_accuracy:
            raise ValueError(f"expected_accuracy has no entry for variant {variant!r}")
        truth = _vector(raw, "outcomes", variant)
        if truth.shape[0] == 0:
            raise ValueError(f"outcomes of variant {variant!r} hold no requests")
        if not np.all((truth == 0) | (truth == 1)):
            raise ValueError(f"outcomes of variant {variant!r} must be 0 or 1")
        estimate = _vector(expected_accuracy[variant], "expected_accuracy", variant)
        if estimate.shape != truth.shape:
            raise ValueError(
                f"expected_accuracy of variant {variant!r} has shape {estimate.shape}, "
                f"outcomes have {truth.shape}"
            )
        if np.any((estimate < 0) | (estimate > 1)):
            raise ValueError(f"expected_accuracy of variant {variant!r} must lie in [0, 1]")
        profiled = float(profiled_accuracy[variant])
        if not math.isfinite(profiled) or not 0 <= profiled <= 1:
            raise ValueError(
                f"profiled_accuracy of variant {variant!r} must lie in [0, 1]; got {profiled!r}"
            )
        result[variant] = AccuracyMae(
            profiled_mae=float(np.abs(truth - profiled).mean()),
            sneakpeek_mae=float(np.abs(truth - estimate).mean()),
            observed_accuracy=float(truth.mean()),
            n_requests=int(truth.shape[0]),
        )
    return result
