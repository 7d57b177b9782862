"""Dirichlet priors over an application's class frequencies.

SneakPeek treats the class frequencies ``theta`` near a request as unknown, with a
Dirichlet prior ``Dir(alpha)``; the labels of the request's ``k`` nearest training rows
are multinomial evidence, and the posterior is ``Dir(alpha + counts)``. The prior decides
how much ``k`` neighbours can move the estimate: the posterior mean is
``(alpha + counts) / (sum(alpha) + k)``, so ``sum(alpha)`` (the concentration) acts as
that many pseudo-neighbours.

Three kinds:

* ``jeffreys`` (the default, :data:`DEFAULT_PRIOR`): ``0.5`` per class, whatever the
  training frequencies; the uninformative choice, the neighbours dominate.
* ``weak``: centred on the training frequencies with concentration ``C`` (the number of
  classes) unless given: about as many pseudo-neighbours as classes.
* ``strong``: same centre, concentration ``100`` unless given: the neighbours barely move
  the estimate away from the training frequencies.
"""

from __future__ import annotations

import math
from typing import Final, Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "DEFAULT_PRIOR",
    "JEFFREYS_ALPHA",
    "PRIOR_KINDS",
    "STRONG_CONCENTRATION",
    "PriorKind",
    "dirichlet_alpha",
]

PriorKind = Literal["jeffreys", "weak", "strong"]
PRIOR_KINDS: Final[tuple[str, ...]] = get_args(PriorKind)
DEFAULT_PRIOR: Final[PriorKind] = "jeffreys"
JEFFREYS_ALPHA: Final = 0.5
"""Pseudo-count per class of the Jeffreys prior."""
STRONG_CONCENTRATION: Final = 100.0
"""Default total pseudo-count of the ``strong`` prior."""
FREQUENCY_SUM_TOLERANCE: Final = 1e-6


def dirichlet_alpha(
    kind: str,
    class_frequencies: ArrayLike,
    concentration: float | None = None,
) -> NDArray[np.float64]:
    """Return the Dirichlet parameters ``alpha`` (one pseudo-count per class).

    Args:
        kind: ``jeffreys``, ``weak`` or ``strong`` (see the module docstring).
        class_frequencies: training frequency of each class, shape ``[C]``, non-negative,
            summing to 1 within ``1e-6``. Jeffreys uses only its length (``C``).
        concentration: ``sum(alpha)`` for ``weak`` and ``strong`` (> 0); ``None`` takes
            the kind's default (``C`` for weak, 100 for strong). Jeffreys takes none.

    Returns:
        ``alpha``, float64 ``[C]``. A class of training frequency 0 gets ``alpha_c = 0``
        under ``weak``/``strong`` (the degenerate limit: only neighbour evidence can give
        it mass, and neighbours come from the training set, so it stays at 0).

    Raises:
        ValueError: naming ``kind``, ``class_frequencies`` or ``concentration``.

    Example: frequencies ``[0.2, 0.8]``::

        jeffreys                 -> [0.5, 0.5]
        weak (concentration 2)   -> [0.4, 1.6]
        strong (concentration 100) -> [20.0, 80.0]

    With 5 neighbours of which 4 are class 1, the posterior means are
    ``[1.5, 4.5] / 6 = [0.25, 0.75]`` (Jeffreys), ``[1.4, 5.6] / 7 = [0.2, 0.8]`` (weak)
    and ``[21, 84] / 105 = [0.2, 0.8]`` (strong).
    """
    if kind not in PRIOR_KINDS:
        raise ValueError(f"kind must be one of {', '.join(PRIOR_KINDS)}; got {kind!r}")
    frequencies = _check_frequencies(class_frequencies)
    num_classes = frequencies.shape[0]
    if kind == "jeffreys":
        if concentration is not None:
            raise ValueError(
                "concentration applies only to the weak and strong priors; "
                f"the jeffreys prior is {JEFFREYS_ALPHA} per class (got {concentration!r})"
            )
        return np.full(num_classes, JEFFREYS_ALPHA, dtype=np.float64)
    if concentration is None:
        total = float(num_classes) if kind == "weak" else STRONG_CONCENTRATION
    else:
        total = _check_concentration(concentration)
    return frequencies * total


def _check_frequencies(class_frequencies: ArrayLike) -> NDArray[np.float64]:
    try:
        frequencies = np.asarray(class_frequencies, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"class_frequencies must be numbers: {error}") from None
    if frequencies.ndim != 1 or frequencies.shape[0] < 1:
        raise ValueError(
            "class_frequencies must be a non-empty 1-D array (one frequency per class); "
            f"got shape {frequencies.shape}"
        )
    if not np.all(np.isfinite(frequencies)):
        raise ValueError("class_frequencies must be finite")
    if np.any(frequencies < 0):
        bad = int(np.flatnonzero(frequencies < 0)[0])
        raise ValueError(
            f"class_frequencies must be non-negative; class {bad} has {frequencies[bad]!r}"
        )
    total = float(frequencies.sum())
    if abs(total - 1.0) > FREQUENCY_SUM_TOLERANCE:
        raise ValueError(
            f"class_frequencies must sum to 1 (within {FREQUENCY_SUM_TOLERANCE:g}); "
            f"they sum to {total!r}"
        )
    return frequencies


def _check_concentration(concentration: float) -> float:
    if isinstance(concentration, bool):
        raise ValueError(f"concentration must be a number > 0; got {concentration!r}")
    try:
        total = float(concentration)
    except (TypeError, ValueError):
        raise ValueError(f"concentration must be a number > 0; got {concentration!r}") from None
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"concentration must be a finite number > 0; got {concentration!r}")
    return total
