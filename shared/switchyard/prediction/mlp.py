"""A small neural service-time model shared by every (model, worker type).

Inputs of one request: five numeric terms, standardised with the training set's mean
and spread (``p`` and ``h`` the prompt and hint lengths in tokens)::

    p/1000, log(1 + p), h/1000, log(1 + h), has_hint      (h = 0 without a hint)

then one-hot codes of the workload class, of the model and of the worker type. The model
and worker-type vocabularies come from :meth:`MlpServiceTimePredictor.fit`; each has one
extra "other" slot for names never seen in training. A few percent of the training rows
(chosen by the seed) are shown with their model and worker type replaced by "other", so
that slot learns the pooled average rather than staying at its random initial weights.

The network (two hidden layers of ``hidden`` ReLU units) predicts the standardised
``log(service_s)``: service times span three orders of magnitude and their errors are
multiplicative, which a log target treats evenly. Exponentiating a mean log gives a
median, which for skewed times sits below the mean a scheduler needs when it sums
queued work; the prediction is therefore multiplied by the smearing factor
``mean(exp(residual))`` of the training residuals (1.0 when the fit is exact, about
``exp(sigma^2 / 2)`` for log-normal residuals of spread ``sigma``).

Training is Adam for ``epochs`` passes over the data in shuffled mini-batches; the
weight initialisation, the shuffles and the "other" rows all derive from ``seed`` and
torch runs on one CPU thread, so the same seed and data give the same predictions.
Online, each completion enters a bounded replay buffer of recent completions and the
network takes a few plain SGD steps on small batches drawn from it (always including the
newest completion).

torch is imported only inside methods: services that never train an MLP never load it.
:meth:`MlpServiceTimePredictor.predict_s` does not touch torch either; it runs the
forward pass on numpy copies of the weights, which every fit and update refresh.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

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
from switchyard.torch_training import Adam, one_thread

if TYPE_CHECKING:
    import torch

__all__ = ["MlpServiceTimePredictor"]

_NUMERIC = 5
_WORKLOAD_SLOT: dict[WorkloadType, int] = {w: i for i, w in enumerate(WORKLOADS)}
_OTHER_FRACTION = 0.05
"""Share of training rows whose model (and, independently, worker type) is shown as
"other", to train the slot used for names unseen in training."""
_MIN_BATCH = 256
_MAX_BATCHES_PER_EPOCH = 32
"""Mini-batches of at least ``_MIN_BATCH`` rows, and at most this many per epoch: large
training sets get larger batches rather than a training time that grows without bound."""
_ONLINE_STEPS = 2
_ONLINE_BATCH = 32
_WARMUP = 32
"""Completions collected by an untrained predictor before it fits them as a batch."""
_MAX_CACHED_COMBINATIONS = 4096
_MAX_LOG_S = 30.0
"""Largest log-seconds exponentiated (about 340 years): keeps exp() finite."""


def _numeric(features: ServiceTimeFeatures) -> list[float]:
    prompt = features.prompt_tokens
    hint = features.output_tokens_hint
    if hint is None:
        return [prompt / 1000.0, math.log1p(prompt), 0.0, 0.0, 0.0]
    return [prompt / 1000.0, math.log1p(prompt), hint / 1000.0, math.log1p(hint), 1.0]


class MlpServiceTimePredictor:
    """A torch MLP over request terms and one-hot model and worker type, on log seconds.

    ``seed`` fixes initialisation, shuffling and replay sampling; ``hidden`` is the width
    of both hidden layers; ``epochs`` and ``learning_rate`` drive the offline Adam
    training (the online SGD steps use the same rate); ``replay`` bounds the buffer of
    recent completions that online updates learn from.
    """

    name: str = "mlp"

    def __init__(
        self,
        *,
        seed: int = 0,
        hidden: int = 32,
        epochs: int = 200,
        learning_rate: float = 1e-2,
        replay: int = 256,
    ) -> None:
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        if not (math.isfinite(learning_rate) and learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if replay < 1:
            raise ValueError(f"replay must be >= 1, got {replay}")
        self.seed = seed
        self.hidden = hidden
        self.epochs = epochs
        self.learning_rate = learning_rate
        self._rng = random.Random(seed)
        self._replay: deque[tuple[NDArray[np.float32], float]] = deque(maxlen=replay)
        """Recent completions as (encoded input row, standardised log target)."""
        self._pending: list[tuple[ServiceTimeFeatures, float]] = []
        self._net: torch.nn.Sequential | None = None
        self._models: dict[str, int] = {}
        self._gpus: dict[str, int] = {}
        self._numeric_mean = np.zeros(_NUMERIC)
        self._numeric_std = np.ones(_NUMERIC)
        self._log_mean = 0.0
        self._log_std = 1.0
        self._smear = 1.0
        # numpy copies of the weights for predict_s, standardisation folded in.
        self._w1_numeric = np.zeros((hidden, _NUMERIC))
        self._b1 = np.zeros(hidden)
        self._w1_categorical = np.zeros((0, hidden))
        self._w2 = np.zeros((hidden, hidden))
        self._b2 = np.zeros(hidden)
        self._w3 = np.zeros(hidden)
        self._b3 = 0.0
        self._first_bias: dict[tuple[WorkloadType, str, str], NDArray[np.float64]] = {}
        """First-layer bias plus the columns of one (workload, model, gpu) combination:
        the one-hot part of the first layer as one vector, built on first use after every
        change of the weights."""

    @property
    def trained(self) -> bool:
        """Whether the network has been fitted (offline, or from enough completions)."""
        return self._net is not None

    # -- prediction --------------------------------------------------------------------

    def predict_s(self, features: ServiceTimeFeatures) -> float:
        """Predicted service time in seconds; unseen model or gpu names use "other"."""
        if self._net is None:
            raise PredictorNotTrainedError(
                "the mlp predictor has not been trained: call fit() first"
                f" (or update() with at least {_WARMUP} completions)"
            )
        key = (features.workload, features.model, features.gpu)
        bias = self._first_bias.get(key)
        if bias is None:
            bias = self._first_bias[key] = self._categorical_bias(key)
        hidden = self._w1_numeric @ np.array(_numeric(features))
        hidden += bias
        np.maximum(hidden, 0.0, out=hidden)
        hidden = self._w2 @ hidden
        hidden += self._b2
        np.maximum(hidden, 0.0, out=hidden)
        log_s = float(self._w3 @ hidden) + self._b3
        seconds = math.exp(min(log_s, _MAX_LOG_S))
        return seconds if seconds > MIN_SERVICE_S else MIN_SERVICE_S

    # -- offline training --------------------------------------------------------------

    def fit(self, samples: Sequence[ServiceTimeFeatures], service_s: Sequence[float]) -> None:
        """Train from scratch with Adam; replaces the network, vocabularies and buffer."""
        check_training_set(samples, service_s)
        self._net = None
        self._pending = []
        self._replay.clear()
        if not samples:
            return
        import torch

        count = len(samples)
        numpy_rng = np.random.default_rng(self.seed)
        self._models = {name: i for i, name in enumerate(sorted({f.model for f in samples}))}
        self._gpus = {name: i for i, name in enumerate(sorted({f.gpu for f in samples}))}
        numeric = np.array([_numeric(f) for f in samples], dtype=np.float64)
        self._numeric_mean = numeric.mean(axis=0)
        spread = numeric.std(axis=0)
        self._numeric_std = np.where(spread > 1e-12, spread, 1.0)
        log_s = np.log(np.maximum(np.asarray(service_s, dtype=np.float64), MIN_SERVICE_S))
        self._log_mean = float(log_s.mean())
        log_spread = float(log_s.std())
        self._log_std = log_spread if log_spread > 1e-12 else 1.0
        model_slot = np.array([self._models[f.model] for f in samples])
        gpu_slot = np.array([self._gpus[f.gpu] for f in samples])
        model_slot[numpy_rng.random(count) < _OTHER_FRACTION] = len(self._models)
        gpu_slot[numpy_rng.random(count) < _OTHER_FRACTION] = len(self._gpus)
        workload_slot = np.array([_WORKLOAD_SLOT[f.workload] for f in samples])
        inputs = self._encode(numeric, workload_slot, model_slot, gpu_slot)
        targets = ((log_s - self._log_mean) / self._log_std).astype(np.float32)

        with one_thread(), torch.random.fork_rng(devices=[]):
            # Only the CPU generator is seeded (and restored after): torch.manual_seed
            # would also queue a seed for CUDA, a side effect no caller asked for.
            torch.default_generator.manual_seed(self.seed)
            shuffle = torch.Generator().manual_seed(self.seed)
            net = torch.nn.Sequential(
                torch.nn.Linear(inputs.shape[1], self.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, self.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, 1),
            )
            x = torch.from_numpy(inputs)
            y = torch.from_numpy(targets)
            adam = Adam(list(net.parameters()), self.learning_rate)
            batch = max(_MIN_BATCH, -(-count // _MAX_BATCHES_PER_EPOCH))
            for _ in range(self.epochs):
                order = torch.randperm(count, generator=shuffle)
                for start in range(0, count, batch):
                    rows = order[start : start + batch]
                    loss = torch.nn.functional.mse_loss(net(x[rows]).squeeze(1), y[rows])
                    adam.step(loss)
            with torch.no_grad():
                fitted = net(x).squeeze(1).numpy().astype(np.float64)
        self._net = net
        residual = (targets.astype(np.float64) - fitted) * self._log_std
        self._smear = float(np.clip(np.mean(np.exp(residual)), 0.1, 10.0))
        # Seed the replay buffer with training rows, so the first online steps rehearse
        # every key rather than only the first completions' ones.
        for row in numpy_rng.permutation(count)[: self._replay.maxlen]:
            self._replay.append((inputs[row], float(targets[row])))
        self._refresh()

    # -- online training ---------------------------------------------------------------

    def update(self, features: ServiceTimeFeatures, observed_s: float) -> None:
        """A few SGD steps on recent completions, this one included.

        Before any fit, completions are collected and the first ``32`` are fitted as a
        batch. Standardisation and vocabularies stay as fitted: a new model or worker type
        keeps using the "other" slot until the next fit.
        """
        check_observation(observed_s)
        net = self._net
        if net is None:
            self._pending.append((features, observed_s))
            if len(self._pending) >= _WARMUP:
                pending = self._pending
                self.fit([f for f, _ in pending], [s for _, s in pending])
            return
        import torch

        # The smearing factor follows the newest residuals (judged before learning from
        # them), so it tracks a change in the spread of service times.
        log_s = math.log(max(observed_s, MIN_SERVICE_S))
        residual = log_s - math.log(self.predict_s(features) / self._smear)
        weight = 1.0 / (self._replay.maxlen or 1)
        self._smear += weight * (min(max(math.exp(residual), 0.1), 10.0) - self._smear)

        models = len(self._models)
        row = self._encode(
            np.array([_numeric(features)]),
            np.array([_WORKLOAD_SLOT[features.workload]]),
            np.array([self._models.get(features.model, models)]),
            np.array([self._gpus.get(features.gpu, len(self._gpus))]),
        )[0]
        self._replay.append((row, (log_s - self._log_mean) / self._log_std))
        replay = self._replay
        parameters = list(net.parameters())
        with one_thread():
            for _ in range(_ONLINE_STEPS):
                drawn = self._rng.sample(
                    range(len(replay) - 1), min(len(replay), _ONLINE_BATCH) - 1
                )
                batch = [replay[-1], *(replay[i] for i in drawn)]
                x = torch.from_numpy(np.stack([r for r, _ in batch]))
                y = torch.tensor([t for _, t in batch], dtype=torch.float32)
                for parameter in parameters:
                    parameter.grad = None
                loss = torch.nn.functional.mse_loss(net(x).squeeze(1), y)
                loss.backward()  # type: ignore[no-untyped-call]
                with torch.no_grad():
                    for parameter in parameters:
                        if parameter.grad is not None:
                            parameter.add_(parameter.grad, alpha=-self.learning_rate)
        self._refresh()

    # -- internals ---------------------------------------------------------------------

    def _encode(
        self,
        numeric: NDArray[np.float64],
        workload_slot: NDArray[np.int_],
        model_slot: NDArray[np.int_],
        gpu_slot: NDArray[np.int_],
    ) -> NDArray[np.float32]:
        """Network input rows: standardised numeric terms, then the one-hot codes."""
        count = len(numeric)
        models = len(self._models) + 1
        width = _NUMERIC + len(WORKLOADS) + models + len(self._gpus) + 1
        inputs = np.zeros((count, width), dtype=np.float32)
        inputs[:, :_NUMERIC] = (numeric - self._numeric_mean) / self._numeric_std
        rows = np.arange(count)
        inputs[rows, _NUMERIC + workload_slot] = 1.0
        inputs[rows, _NUMERIC + len(WORKLOADS) + model_slot] = 1.0
        inputs[rows, _NUMERIC + len(WORKLOADS) + models + gpu_slot] = 1.0
        return inputs

    def _categorical_bias(self, key: tuple[WorkloadType, str, str]) -> NDArray[np.float64]:
        workload, model, gpu = key
        models = len(self._models) + 1
        if len(self._first_bias) >= _MAX_CACHED_COMBINATIONS:
            self._first_bias.clear()  # bounded even if callers invent names without end
        rows = self._w1_categorical
        bias: NDArray[np.float64] = (
            self._b1
            + rows[_WORKLOAD_SLOT[workload]]
            + rows[len(WORKLOADS) + self._models.get(model, models - 1)]
            + rows[len(WORKLOADS) + models + self._gpus.get(gpu, len(self._gpus))]
        )
        return bias

    def _refresh(self) -> None:
        """Copy the weights to numpy for predict_s, folding in both standardisations."""
        import torch

        net = self._net
        assert net is not None
        with torch.no_grad():
            first, second, third = (layer for layer in net if isinstance(layer, torch.nn.Linear))
            w1 = first.weight.detach().numpy().astype(np.float64)
            w1_numeric = w1[:, :_NUMERIC] / self._numeric_std
            self._w1_numeric = np.ascontiguousarray(w1_numeric)
            self._b1 = (
                first.bias.detach().numpy().astype(np.float64) - w1_numeric @ self._numeric_mean
            )
            self._w1_categorical = np.ascontiguousarray(w1[:, _NUMERIC:].T)
            self._w2 = second.weight.detach().numpy().astype(np.float64)
            self._b2 = second.bias.detach().numpy().astype(np.float64)
            self._w3 = third.weight.detach().numpy().astype(np.float64)[0] * self._log_std
            self._first_bias = {}
            self._b3 = (
                float(third.bias.detach().numpy()[0]) * self._log_std
                + self._log_mean
                + math.log(self._smear)
            )
