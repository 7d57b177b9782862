"""One application's SneakPeek estimator, built from its registry entry and its data.

The window simulator and the live sneakpeek service build estimators the same way: a
neighbour index over the application's training split, a Dirichlet prior from the
training class frequencies (the registry's prior kind, or an override), and each
variant's profiled per-class recall.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np

from switchyard.apps.datasets import Dataset, load_dataset
from switchyard.apps.registry import Application
from switchyard.estimation.estimator import SneakPeekEstimator
from switchyard.estimation.index import NeighbourIndex
from switchyard.estimation.prior import dirichlet_alpha

__all__ = ["estimator_for_application"]


def estimator_for_application(
    application: Application,
    *,
    index_kind: str = "flat",
    k: int = 5,
    prior_kind: str | None = None,
    indexes: MutableMapping[str, NeighbourIndex] | None = None,
    dataset: Dataset | None = None,
) -> SneakPeekEstimator:
    """The SneakPeek estimator of ``application``.

    Args:
        application: the registry entry (prior spec, variants' recalls, dataset name).
        index_kind: ``flat``, ``ivf`` or ``hnsw``.
        k: neighbours per request.
        prior_kind: overrides the registry's prior kind (then with the kind's default
            concentration).
        indexes: a cache of indexes by dataset name, shared by applications on one dataset.
        dataset: the application's dataset when the caller has it loaded already.
    """
    data = dataset if dataset is not None else load_dataset(application.dataset)
    cache: MutableMapping[str, NeighbourIndex] = {} if indexes is None else indexes
    if data.name not in cache:
        cache[data.name] = NeighbourIndex.build(data.x_train, data.y_train, index_kind, seed=0)
    frequencies = np.bincount(data.y_train, minlength=data.num_classes) / len(data.y_train)
    kind = application.prior.kind if prior_kind is None else prior_kind
    concentration = application.prior.concentration if prior_kind is None else None
    alpha = dirichlet_alpha(kind, frequencies, None if kind == "jeffreys" else concentration)
    recalls = {name: np.asarray(p.recall) for name, p in application.variants.items()}
    return SneakPeekEstimator(cache[data.name], alpha, recalls, k=k)
