"""Model variants of a classification application: train, predict, save and load.

Each application registers three variants, from light and weak to heavy and strong
(which ones: ``DatasetSpec.variants``):

``logreg-pca1``, ``logreg-pca4``
    scikit-learn ``PCA(k)`` (1 or 4 components) then ``LogisticRegression``. Served
    as one numpy affine map and a softmax (``PCA`` and the logits are both affine, so
    they fold into one ``[features, classes]`` matrix): scikit-learn's own
    ``predict_proba`` spends about 0.3 ms per call checking its input, more than the
    model itself costs.
``mlp-small``
    torch, one hidden layer of 32 ReLU units.
``mlp-large``
    torch, two hidden layers of 512 ReLU units.

The networks train on the standardised training split with full-batch Adam for a fixed
number of epochs, from ``torch.manual_seed(seed)``, on one CPU thread: the same seed
gives the same weights. Adam is written out (:class:`switchyard.torch_training.Adam`)
because ``torch.optim`` loads torch's compiler stack on first use, which costs more than
a whole fit here.

Files: a ``logreg-pca*`` variant is a pickle (``.pkl``) of the fitted scikit-learn pipeline inside
a small tagged dict. A network is a JSON header (``.json``: architecture and dimensions)
beside its ``torch.save(state_dict)`` weights (``.pt``, loaded with
``weights_only=True``), so loading a network unpickles no torch module. Only load a
``.pkl`` you built: unpickling runs code.

torch and scikit-learn are imported inside functions only; importing this module loads
neither.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from switchyard.apps.datasets import Dataset
from switchyard.torch_training import Adam, one_thread

if TYPE_CHECKING:
    import torch

__all__ = [
    "VARIANT_NAMES",
    "VARIANT_SPECS",
    "LogRegPcaVariant",
    "TorchMlpVariant",
    "Variant",
    "VariantFileError",
    "VariantSpec",
    "load_variant",
    "train_application",
    "train_variant",
]

_SKLEARN_FORMAT = "switchyard.apps.logreg-pca"
_TORCH_FORMAT = "switchyard.apps.torch-mlp"
_FORMAT_VERSION = 1


class VariantFileError(ValueError):
    """A model file that is missing, of an unknown kind, or does not hold a variant."""


@dataclass(frozen=True, kw_only=True)
class VariantSpec:
    """How one variant is built.

    Attributes:
        name: the variant name (a key of the registry's ``variants``).
        kind: ``"logreg-pca"`` (scikit-learn) or ``"mlp"`` (torch).
        pca_components: logreg-pca only; principal components kept.
        hidden: mlp only; the hidden layer widths.
        epochs: mlp only; full-batch Adam steps.
        learning_rate: mlp only; Adam's step size.
    """

    name: str
    kind: Literal["logreg-pca", "mlp"]
    pca_components: int = 0
    hidden: tuple[int, ...] = ()
    epochs: int = 0
    learning_rate: float = 0.0


VARIANT_SPECS: dict[str, VariantSpec] = {
    spec.name: spec
    for spec in (
        VariantSpec(name="logreg-pca1", kind="logreg-pca", pca_components=1),
        VariantSpec(name="logreg-pca4", kind="logreg-pca", pca_components=4),
        VariantSpec(name="mlp-small", kind="mlp", hidden=(32,), epochs=300, learning_rate=1e-2),
        VariantSpec(
            name="mlp-large", kind="mlp", hidden=(512, 512), epochs=100, learning_rate=1e-3
        ),
    )
}
VARIANT_NAMES: tuple[str, ...] = tuple(VARIANT_SPECS)


class Variant(Protocol):
    """A trained classifier over a dataset's standardised features."""

    @property
    def name(self) -> str: ...

    @property
    def input_dim(self) -> int: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def file_suffix(self) -> str:
        """The suffix of the model file :meth:`save` writes (``.pkl``, ``.json``)."""
        ...

    def predict_proba(self, x: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
        """Class probabilities of a batch: ``[n, input_dim]`` -> ``[n, num_classes]``.

        Raises:
            ValueError: when ``x`` is not two-dimensional with ``input_dim`` columns.
        """
        ...

    def memory_bytes(self) -> int:
        """Bytes of the model: parameter bytes for a network, pickle bytes otherwise."""
        ...

    def save(self, path: Path) -> None:
        """Write the model to ``path`` (and, for a network, its weights beside it)."""
        ...


def _check_batch(x: NDArray[np.floating[Any]], input_dim: int) -> None:
    if x.ndim != 2 or x.shape[1] != input_dim:
        raise ValueError(f"x: expected shape [n, {input_dim}], got {list(x.shape)}")


def _softmax(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    exps: NDArray[np.float64] = np.exp(logits - logits.max(axis=1, keepdims=True))
    exps /= exps.sum(axis=1, keepdims=True)
    return exps


class _Shape:
    """What every variant states about itself: its name and its input and output sizes."""

    def __init__(self, name: str, input_dim: int, num_classes: int) -> None:
        self._name = name
        self._input_dim = input_dim
        self._num_classes = num_classes

    @property
    def name(self) -> str:
        return self._name

    @property
    def input_dim(self) -> int:
        return self._input_dim

    @property
    def num_classes(self) -> int:
        return self._num_classes


class LogRegPcaVariant(_Shape):
    """``PCA`` then ``LogisticRegression``, folded into one affine map for prediction."""

    file_suffix = ".pkl"

    def __init__(self, *, name: str, model: Any) -> None:
        """Wrap a fitted scikit-learn ``Pipeline([PCA, LogisticRegression])``."""
        pca, logreg = model[0], model[-1]
        projection = np.asarray(pca.components_, dtype=np.float64).T  # [d, k]
        coef = np.asarray(logreg.coef_, dtype=np.float64)  # [C or 1, k]
        weights = projection @ coef.T  # [d, C or 1]
        mean = np.asarray(pca.mean_, dtype=np.float64)
        super().__init__(name, int(projection.shape[0]), len(logreg.classes_))
        self._model = model
        self._weights = weights
        self._bias = np.asarray(logreg.intercept_, dtype=np.float64) - mean @ weights
        self._binary = coef.shape[0] == 1

    @property
    def model(self) -> Any:
        """The fitted scikit-learn pipeline."""
        return self._model

    def predict_proba(self, x: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
        _check_batch(x, self._input_dim)
        logits = np.asarray(x, dtype=np.float64) @ self._weights + self._bias
        if self._binary:
            # scikit-learn's binary model: P(class 1) = logistic(z), P(class 0) = 1 - that.
            positive = 1.0 / (1.0 + np.exp(-logits[:, 0]))
            return np.stack([1.0 - positive, positive], axis=1)
        return _softmax(logits)

    def memory_bytes(self) -> int:
        return len(pickle.dumps(self._model, protocol=pickle.HIGHEST_PROTOCOL))

    def save(self, path: Path) -> None:
        payload = {
            "format": _SKLEARN_FORMAT,
            "version": _FORMAT_VERSION,
            "name": self._name,
            "model": self._model,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))


def _build_mlp(input_dim: int, hidden: Sequence[int], num_classes: int) -> torch.nn.Sequential:
    import torch

    layers: list[torch.nn.Module] = []
    width = input_dim
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    layers.append(torch.nn.Linear(width, num_classes))
    return torch.nn.Sequential(*layers)


class TorchMlpVariant(_Shape):
    """A torch multilayer perceptron (ReLU hidden layers, softmax output)."""

    file_suffix = ".json"

    def __init__(
        self,
        *,
        name: str,
        input_dim: int,
        hidden: Sequence[int],
        num_classes: int,
        network: torch.nn.Sequential | None = None,
    ) -> None:
        """Wrap ``network``, or build an untrained one of this shape when it is ``None``."""
        super().__init__(name, input_dim, num_classes)
        self._hidden = tuple(hidden)
        self._network = (
            network if network is not None else _build_mlp(input_dim, hidden, num_classes)
        )
        self._network.eval()

    @property
    def hidden(self) -> tuple[int, ...]:
        return self._hidden

    @property
    def network(self) -> torch.nn.Sequential:
        return self._network

    def predict_proba(self, x: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
        import torch

        _check_batch(x, self._input_dim)
        rows = np.ascontiguousarray(x, dtype=np.float32)
        if not rows.flags.writeable:
            rows = rows.copy()  # torch.from_numpy warns on read-only arrays
        batch = torch.from_numpy(rows)
        with one_thread(), torch.inference_mode():
            probabilities = torch.softmax(self._network(batch), dim=1)
        return probabilities.numpy().astype(np.float64)

    def memory_bytes(self) -> int:
        tensors = [*self._network.parameters(), *self._network.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def save(self, path: Path) -> None:
        import torch

        weights = path.with_suffix(".pt")
        header = {
            "format": _TORCH_FORMAT,
            "version": _FORMAT_VERSION,
            "name": self._name,
            "architecture": "mlp-relu",
            "input_dim": self._input_dim,
            "hidden": list(self._hidden),
            "num_classes": self._num_classes,
            "weights_file": weights.name,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self._network.state_dict(), weights)
        path.write_text(json.dumps(header, indent=2) + "\n", encoding="utf-8")


def _train_mlp(spec: VariantSpec, dataset: Dataset, seed: int) -> TorchMlpVariant:
    import torch

    x = torch.from_numpy(np.array(dataset.x_train, dtype=np.float32))
    y = torch.from_numpy(np.array(dataset.y_train, dtype=np.int64))
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        variant = TorchMlpVariant(
            name=spec.name,
            input_dim=dataset.feature_dim,
            hidden=spec.hidden,
            num_classes=dataset.num_classes,
        )
        network = variant.network
        network.train()
        optimiser = Adam(list(network.parameters()), spec.learning_rate)
        for _ in range(spec.epochs):
            optimiser.step(torch.nn.functional.cross_entropy(network(x), y))
        network.eval()
    return variant


def _train_logreg_pca(spec: VariantSpec, dataset: Dataset, seed: int) -> LogRegPcaVariant:
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    model = Pipeline(
        [
            ("pca", PCA(n_components=spec.pca_components, random_state=seed)),
            ("logreg", LogisticRegression(max_iter=5000, random_state=seed)),
        ]
    )
    model.fit(np.asarray(dataset.x_train, dtype=np.float64), dataset.y_train)
    return LogRegPcaVariant(name=spec.name, model=model)


def train_variant(name: str, dataset: Dataset, seed: int) -> Variant:
    """Train the variant called ``name`` on ``dataset``'s training split.

    Raises:
        ValueError: for a name not in :data:`VARIANT_NAMES`, listing them.
    """
    try:
        spec = VARIANT_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANT_NAMES)}") from None
    if spec.kind == "mlp":
        return _train_mlp(spec, dataset, seed)
    return _train_logreg_pca(spec, dataset, seed)


def train_application(
    dataset: Dataset,
    out_dir: Path,
    seed: int,
    variants: Sequence[str] = VARIANT_NAMES,
) -> dict[str, Path]:
    """Train ``variants`` of one application and save them under ``out_dir/<dataset>/``.

    Returns:
        variant name -> its model file (``.pkl`` or ``.json``), in ``variants`` order.

    Example:
        >>> train_application(load_dataset("digits"), Path("models"), seed=0)["mlp-small"]
        PosixPath('models/digits/mlp-small.json')
    """
    files: dict[str, Path] = {}
    folder = out_dir / dataset.name
    for name in variants:
        variant = train_variant(name, dataset, seed)
        path = folder / f"{name}{variant.file_suffix}"
        variant.save(path)
        files[name] = path
    return files


def _load_torch(path: Path) -> TorchMlpVariant:
    import torch

    try:
        header = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(header, dict) or header.get("format") != _TORCH_FORMAT:
            raise VariantFileError(f"{path}: not a switchyard torch variant header")
        input_dim = int(header["input_dim"])
        hidden = [int(size) for size in header["hidden"]]
        num_classes = int(header["num_classes"])
        weights = path.parent / str(header["weights_file"])
        variant = TorchMlpVariant(
            name=str(header["name"]), input_dim=input_dim, hidden=hidden, num_classes=num_classes
        )
        state = torch.load(weights, map_location="cpu", weights_only=True)
        variant.network.load_state_dict(state)
    except VariantFileError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, pickle.UnpicklingError) as exc:
        raise VariantFileError(f"{path}: cannot load the variant: {exc}") from None
    variant.network.eval()
    return variant


def _load_sklearn(path: Path) -> LogRegPcaVariant:
    try:
        payload = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        raise VariantFileError(f"{path}: cannot load the variant: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != _SKLEARN_FORMAT:
        raise VariantFileError(f"{path}: not a switchyard scikit-learn variant")
    return LogRegPcaVariant(name=str(payload["name"]), model=payload["model"])


def load_variant(path: Path) -> Variant:
    """Load a variant written by :meth:`Variant.save` (kind chosen by the file suffix).

    Raises:
        VariantFileError: for an unknown suffix, a missing or unreadable file, or a
            file that does not hold a variant.
    """
    path = Path(path)
    if path.suffix == ".json":
        return _load_torch(path)
    if path.suffix == ".pkl":
        return _load_sklearn(path)
    raise VariantFileError(f"{path}: unknown model file kind (expected .json or .pkl)")
