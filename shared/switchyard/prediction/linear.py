"""A linear service-time model per (model, worker type), learnt offline and tracked online.

Terms of one request (prompt and hint in thousands of tokens, so every column is of
order one and the normal equations stay well conditioned)::

    x = [1, p, p^2, h, has_hint, code, conversation, other]
    p = prompt_tokens / 1000        h = output_tokens_hint / 1000 (0 without a hint)

and the prediction is ``s^ = max(w . x, MIN_SERVICE_S)``. For example with
``w = [0.5, 0.2, 0.01, 0, 0, 0.1, 0.3, 0]`` a 2,000-token conversation prompt predicts
``0.5 + 0.2*2 + 0.01*4 + 0.3 = 1.24 s``.

Offline, :meth:`LinearServiceTimePredictor.fit` solves the ridge-regularised least
squares ``(X'X + ridge*I) w = X'y`` for each key. Online,
:meth:`LinearServiceTimePredictor.update` is recursive least squares with a forgetting
factor ``lambda``: every completion discounts the past by ``lambda`` before adding
itself, so a sample ``k`` completions old weighs ``lambda^k`` (0.999: half weight after
about 693 completions) and the model follows drift. It is kept in its regularised form,
the exponentially weighted normal equations

    A <- lambda*A + x x' + (1 - lambda)*ridge*I        b <- lambda*b + y x

re-solved every ``solve_every`` completions (default 8): the pending samples are folded in
together, each discounted once per later sample, which gives exactly the equations of that
many single steps for one round of numpy calls; predictions in between use the last
solution. The classic covariance form of
RLS divides its matrix by ``lambda`` on every step, which blows up along directions no
completion excites (the hint columns when clients never send one, the workloads a key
never sees); here the ``ridge*I`` term is never forgotten, so those directions stay
bounded and their weights decay to zero.

Besides the per-key models a global model learns from every sample. It answers for a
(model, worker type) that has too little data of its own, so a new worker type gets a
sensible estimate at once; only a predictor that learnt nothing at all raises
:class:`PredictorNotTrainedError`.

:meth:`LinearServiceTimePredictor.export_state` gives everything learnt as plain floats
(:class:`LinearPredictorState`: each model's weights and normal equations), from which
:meth:`LinearServiceTimePredictor.from_state` rebuilds a predictor that predicts and
learns on exactly as the exported one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from switchyard.contracts.messages import WorkloadType
from switchyard.prediction.base import (
    MIN_SERVICE_S,
    PredictorNotTrainedError,
    check_observation,
    check_training_set,
)
from switchyard.prediction.features import WORKLOADS, ServiceTimeFeatures

__all__ = [
    "TERM_NAMES",
    "LinearModelState",
    "LinearPredictorState",
    "LinearServiceTimePredictor",
    "linear_terms",
]

TERM_NAMES: tuple[str, ...] = (
    "intercept",
    "prompt_ktok",
    "prompt_ktok_sq",
    "hint_ktok",
    "has_hint",
    *(f"workload_{w.value}" for w in WORKLOADS),
)
"""Names of the terms of :func:`linear_terms`, in order."""

_TERMS = len(TERM_NAMES)
_WORKLOAD_COLUMN: dict[WorkloadType, int] = {w: 5 + i for i, w in enumerate(WORKLOADS)}
_MIN_KEY_WEIGHT = 2.0 * _TERMS
"""A key's own model answers once it has seen this many (discounted) samples: fewer
than about two per unknown and its least-squares solution is mostly regulariser."""


def linear_terms(features: ServiceTimeFeatures) -> list[float]:
    """The term vector ``x`` of one request (see the module docstring)."""
    prompt_ktok = features.prompt_tokens / 1000.0
    row = [1.0, prompt_ktok, prompt_ktok * prompt_ktok, 0.0, 0.0, 0.0, 0.0, 0.0]
    if features.output_tokens_hint is not None:
        row[3] = features.output_tokens_hint / 1000.0
        row[4] = 1.0
    row[_WORKLOAD_COLUMN[features.workload]] = 1.0
    return row


@dataclass(frozen=True, slots=True)
class LinearModelState:
    """One linear model as plain floats: its weights and the normal equations behind them.

    ``coef`` (one weight per term of :data:`TERM_NAMES`) is what predictions use;
    ``gram`` (the matrix ``A``, row-major) and ``moment`` (``b``) are what learning goes
    on from; ``weight`` is the effective (discounted) number of samples. A
    :class:`ValueError` names a field of the wrong length.
    """

    coef: tuple[float, ...]
    weight: float
    gram: tuple[float, ...]
    moment: tuple[float, ...]

    def __post_init__(self) -> None:
        for name, expected in (("coef", _TERMS), ("gram", _TERMS * _TERMS), ("moment", _TERMS)):
            got = len(getattr(self, name))
            if got != expected:
                raise ValueError(f"{name} must hold {expected} floats, got {got}")


@dataclass(frozen=True, slots=True)
class LinearPredictorState:
    """Everything a :class:`LinearServiceTimePredictor` learnt, and how it learns.

    ``keys`` maps (model, gpu) to that key's model; ``global_model`` is None before
    anything was learnt.
    """

    ridge: float
    forgetting: float
    solve_every: int
    global_model: LinearModelState | None
    keys: Mapping[tuple[str, str], LinearModelState]

    def coefficients_for(self, model: str, gpu: str) -> tuple[float, ...] | None:
        """The weights a prediction for (model, gpu) uses: the key's own once it has seen
        enough samples, else the global ones; None when there are neither."""
        own = self.keys.get((model, gpu))
        if own is not None and own.weight >= _MIN_KEY_WEIGHT:
            return own.coef
        return None if self.global_model is None else self.global_model.coef


class _KeyModel:
    """The exponentially weighted normal equations of one key and their solution."""

    __slots__ = ("_coef", "_solved", "gram", "moment", "pending", "weight")
    # ``pending`` holds the (terms, observed seconds) of updates not yet folded in.
    # The equations are solved when their weights are next read, not at every fold: a
    # model nobody predicts with between two folds (the global model of a mixed cluster
    # while every key has enough data of its own) then costs no solve at all, and the
    # weights read are the same as if every fold had solved.

    def __init__(
        self,
        gram: NDArray[np.float64],
        moment: NDArray[np.float64],
        weight: float,
        coef: tuple[float, ...] | None = None,
    ):
        self.gram = gram
        self.moment = moment
        self.weight = weight
        """Effective (discounted) number of samples behind the model."""
        self._coef: tuple[float, ...] = ()
        self._solved = False
        self.pending: list[tuple[list[float], float]] = []
        if coef is not None:
            # A restored model keeps the exported solution rather than solving again: a
            # solve on another machine's BLAS may differ in the last bit.
            self._coef = coef
            self._solved = True

    @classmethod
    def restored(cls, state: LinearModelState) -> _KeyModel:
        return cls(
            np.array(state.gram, dtype=np.float64).reshape(_TERMS, _TERMS),
            np.array(state.moment, dtype=np.float64),
            state.weight,
            state.coef,
        )

    def same_equations(self, other: _KeyModel) -> bool:
        """Whether both hold exactly the same equations (bit for bit), nothing pending."""
        return (
            not self.pending
            and not other.pending
            and self.weight == other.weight
            and bool(np.array_equal(self.gram, other.gram))
            and bool(np.array_equal(self.moment, other.moment))
        )

    def copy(self) -> _KeyModel:
        """An independent model with the same equations, weights and pending updates."""
        twin = _KeyModel(self.gram.copy(), self.moment.copy(), self.weight)
        twin._coef = self._coef
        twin._solved = self._solved
        twin.pending = list(self.pending)
        return twin

    def exported(self) -> LinearModelState:
        """The model as plain floats; its pending updates must have been folded in."""
        return LinearModelState(
            coef=self.coef,
            weight=self.weight,
            gram=tuple(self.gram.ravel().tolist()),
            moment=tuple(self.moment.tolist()),
        )

    @property
    def coef(self) -> tuple[float, ...]:
        """The weights: the solution of the equations as folded so far."""
        if not self._solved:
            # Kept as a tuple of Python floats: predict_s then runs without numpy.
            self._coef = tuple(np.linalg.solve(self.gram, self.moment).tolist())
            self._solved = True
        return self._coef

    def invalidate(self) -> None:
        """The equations changed: solve again when the weights are next read."""
        self._solved = False


class LinearServiceTimePredictor:
    """Ridge regression per (model, gpu), updated online by recursive least squares.

    ``ridge`` (> 0) is the regulariser in units of the scaled terms; ``forgetting`` in
    (0, 1] is the RLS forgetting factor (1 remembers everything equally); the weights are
    re-solved after every ``solve_every`` online updates.
    """

    name: str = "linear"

    def __init__(
        self, *, ridge: float = 1e-3, forgetting: float = 0.999, solve_every: int = 8
    ) -> None:
        if not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be > 0, got {ridge}")
        if not (0 < forgetting <= 1):
            raise ValueError(f"forgetting must be within (0, 1], got {forgetting}")
        if solve_every < 1:
            raise ValueError(f"solve_every must be at least 1, got {solve_every}")
        self.ridge = ridge
        self.forgetting = forgetting
        # Every update folds into the normal equations at once; re-solving them (an 8x8
        # system, most of an update's cost) waits for this many, as batched RLS.
        self.solve_every = solve_every
        self._keys: dict[tuple[str, str], _KeyModel] = {}
        self._global: _KeyModel | None = None
        self._decays: dict[int, _Decay] = {}

    @property
    def keys(self) -> tuple[tuple[str, str], ...]:
        """The (model, gpu) pairs with a model of their own."""
        return tuple(self._keys)

    def coefficients(self, key: tuple[str, str] | None = None) -> dict[str, float]:
        """The learnt weights by term name: of one (model, gpu) key, or of the global model."""
        chosen = self._global if key is None else self._keys.get(key)
        if chosen is None:
            raise PredictorNotTrainedError(f"no linear model for key {key!r}")
        return dict(zip(TERM_NAMES, chosen.coef, strict=True))

    def predict_s(self, features: ServiceTimeFeatures) -> float:
        """``max(w . x, MIN_SERVICE_S)`` with the key's weights, or the global ones."""
        chosen = self._keys.get((features.model, features.gpu))
        if chosen is None or chosen.weight < _MIN_KEY_WEIGHT:
            chosen = self._global
            if chosen is None:
                raise PredictorNotTrainedError(
                    "the linear predictor has not been trained: call fit() or update() first"
                )
        # The dot product written out: this runs per request per worker type.
        w = chosen._coef if chosen._solved else chosen.coef
        prompt_ktok = features.prompt_tokens * 1e-3
        seconds = (
            w[0]
            + prompt_ktok * (w[1] + prompt_ktok * w[2])
            + w[_WORKLOAD_COLUMN[features.workload]]
        )
        hint = features.output_tokens_hint
        if hint is not None:
            seconds += w[3] * hint * 1e-3 + w[4]
        return seconds if seconds > MIN_SERVICE_S else MIN_SERVICE_S

    def fit(self, samples: Sequence[ServiceTimeFeatures], service_s: Sequence[float]) -> None:
        """Ridge least squares per key and globally; replaces everything learnt before."""
        check_training_set(samples, service_s)
        self._keys = {}
        self._global = None
        if not samples:
            return
        design = np.array([linear_terms(f) for f in samples], dtype=np.float64)
        labels = np.asarray(service_s, dtype=np.float64)
        rows_by_key: dict[tuple[str, str], list[int]] = {}
        for index, f in enumerate(samples):
            rows_by_key.setdefault((f.model, f.gpu), []).append(index)
        for key, rows in rows_by_key.items():
            self._keys[key] = self._batch(design[rows], labels[rows])
        self._global = self._batch(design, labels)
        if len(self._keys) == 1:
            # One key saw every sample, so the global model is the same equations: it
            # shares the key's model (one fold per update, not two) until another key
            # learns something (update() then gives it a copy of its own).
            (only,) = self._keys.values()
            if self._global.same_equations(only):
                self._global = only

    @property
    def _shares_global(self) -> bool:
        return self._global is not None and any(m is self._global for m in self._keys.values())

    def update(self, features: ServiceTimeFeatures, observed_s: float) -> None:
        """One RLS step with forgetting on the key's model and on the global model."""
        check_observation(observed_s)
        x = linear_terms(features)
        key = (features.model, features.gpu)
        model = self._keys.get(key)
        if model is None:
            if self._shares_global:
                assert self._global is not None
                self._global = self._global.copy()  # the global model learns on alone
            model = self._keys[key] = self._empty()
        if self._global is None:
            self._global = self._empty()
        self._step(model, x, observed_s)
        if self._global is not model:
            self._step(self._global, x, observed_s)

    def export_state(self) -> LinearPredictorState:
        """Everything learnt, as plain floats (a checkpoint, or weights to predict with
        elsewhere).

        Updates still pending are folded in first, so the export leaves nothing out; this
        predictor goes on from the folded equations too (the equations its next solve
        would have reached, solved a few updates early).
        """
        for model in (*self._keys.values(), self._global):
            if model is not None and model.pending:
                self._fold(model)
        return LinearPredictorState(
            ridge=self.ridge,
            forgetting=self.forgetting,
            solve_every=self.solve_every,
            global_model=None if self._global is None else self._global.exported(),
            keys={key: model.exported() for key, model in self._keys.items()},
        )

    @classmethod
    def from_state(cls, state: LinearPredictorState) -> LinearServiceTimePredictor:
        """A predictor that predicts and learns on exactly as the one ``state`` came from."""
        predictor = cls(
            ridge=state.ridge, forgetting=state.forgetting, solve_every=state.solve_every
        )
        predictor._keys = {key: _KeyModel.restored(model) for key, model in state.keys.items()}
        if state.global_model is not None:
            predictor._global = _KeyModel.restored(state.global_model)
        return predictor

    # -- internals -------------------------------------------------------------------

    def _batch(self, design: NDArray[np.float64], labels: NDArray[np.float64]) -> _KeyModel:
        gram = design.T @ design + self.ridge * np.eye(_TERMS)
        return _KeyModel(gram, design.T @ labels, float(len(labels)))

    def _empty(self) -> _KeyModel:
        return _KeyModel(self.ridge * np.eye(_TERMS), np.zeros(_TERMS), 0.0)

    def _step(self, model: _KeyModel, x: list[float], observed_s: float) -> None:
        model.pending.append((x, observed_s))
        if len(model.pending) >= self.solve_every:
            self._fold(model)

    def _fold(self, model: _KeyModel) -> None:
        """Fold the pending updates into the equations, each discounted by the
        forgetting factor once per later update, and have them solved again when next
        read: the same result as that many single RLS steps, for one round of numpy
        calls."""
        pending = model.pending
        count = len(pending)
        decay = self._decays.get(count)
        if decay is None:
            decay = self._decays[count] = _Decay(self.forgetting, count)
        rows = np.array([x for x, _ in pending], dtype=np.float64)
        observed = np.array([y for _, y in pending], dtype=np.float64)
        kept = decay.kept
        gram = model.gram
        gram *= kept
        gram += rows.T @ (rows * decay.column)
        # Re-add the regulariser the discount just took away, so it is never forgotten.
        gram.flat[:: _TERMS + 1] += (1.0 - kept) * self.ridge
        model.moment *= kept
        model.moment += rows.T @ (decay.weights * observed)
        model.weight = kept * model.weight + decay.total
        model.pending = []
        model.invalidate()


class _Decay:
    """The discounts of one fold of ``count`` updates, computed once per count (a fold
    almost always holds ``solve_every`` updates)."""

    __slots__ = ("column", "kept", "total", "weights")

    def __init__(self, forgetting: float, count: int) -> None:
        self.weights = forgetting ** np.arange(count - 1, -1, -1, dtype=np.float64)
        self.column = self.weights[:, None]
        self.kept = forgetting**count
        self.total = float(self.weights.sum())
