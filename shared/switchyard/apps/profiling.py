"""Measure model variants on this machine and build the application registry from them.

:func:`profile_variant` measures what the scheduler needs to know about one variant:

- ``latency_s``: for each batch size, the median wall-clock seconds of
  ``predict_proba`` on that many test rows, over ``repeats`` calls after
  ``WARMUP_CALLS`` unmeasured ones (``time.perf_counter_ns``; real time on this CPU,
  torch on one thread);
- ``memory_bytes``: parameter bytes of a network, pickle bytes of a scikit-learn model;
- ``load_s``: the median time of :func:`~switchyard.apps.variants.load_variant` from
  disk (file cache warm after the first call);
- ``accuracy`` and per-class ``recall`` on the test split.

:func:`build_registry` trains every variant of the three applications, profiles each
and returns the :class:`~switchyard.apps.registry.Registry` (deadline 150 ms, a sigmoid
penalty, a Jeffreys prior, each dataset's default stream mix).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from switchyard.apps.datasets import DATASET_NAMES, DATASET_SPECS, Dataset, load_dataset
from switchyard.apps.registry import (
    Application,
    PenaltySpec,
    PriorSpec,
    Registry,
    VariantProfile,
)
from switchyard.apps.variants import Variant, load_variant, train_application

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_PENALTY",
    "WARMUP_CALLS",
    "WORKER_TYPE",
    "build_registry",
    "evaluate",
    "profile_variant",
]

WORKER_TYPE = "cpu"
"""The worker type name of the machine the profiles are measured on."""
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
DEFAULT_DEADLINE_S = 0.15
DEFAULT_PENALTY = PenaltySpec(kind="sigmoid", steepness_per_s=100.0, midpoint_s=0.05)
"""Half the value left 50 ms after the deadline, almost none after 100 ms."""
WARMUP_CALLS = 3


def evaluate(variant: Variant, dataset: Dataset) -> tuple[float, tuple[float, ...]]:
    """Accuracy and per-class recall of ``variant`` on ``dataset``'s test split.

    A class with no test row gets recall 0 (never the case for the bundled datasets,
    whose split is stratified).
    """
    predicted = variant.predict_proba(dataset.x_test).argmax(axis=1)
    right = predicted == dataset.y_test
    recall = tuple(
        float(right[dataset.y_test == label].mean()) if np.any(dataset.y_test == label) else 0.0
        for label in range(dataset.num_classes)
    )
    return float(right.mean()), recall


def _median_s(call: Callable[[], object], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    samples_ns: list[int] = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        call()
        samples_ns.append(time.perf_counter_ns() - start)
    # A profile needs a positive time; a clock tick (1 ns) is the floor.
    return max(statistics.median(samples_ns), 1) / 1e9


def profile_variant(
    variant: Variant,
    dataset: Dataset,
    worker_type: str = WORKER_TYPE,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    repeats: int = 20,
    *,
    model_file: Path,
    registry_dir: Path,
) -> VariantProfile:
    """Measure one trained variant (see the module docstring for what and how).

    Args:
        variant: the trained variant.
        dataset: its application's data; latency batches are its first test rows
            (repeated when the split is smaller than a batch).
        worker_type: the name the latencies are filed under.
        batch_sizes: the batch sizes to time, each ``>= 1``.
        repeats: timed calls per batch size (and loads), ``>= 1``.
        model_file: the variant's saved file, timed with ``load_variant``.
        registry_dir: the folder of the registry file; ``model_file`` is stored relative
            to it.

    Raises:
        ValueError: for a bad batch size or repeat count, or a model file outside
            ``registry_dir``.
    """
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    if not batch_sizes or any(size < 1 for size in batch_sizes):
        raise ValueError(f"batch_sizes: expected sizes >= 1, got {list(batch_sizes)}")
    try:
        relative = model_file.resolve().relative_to(registry_dir.resolve()).as_posix()
    except ValueError:
        raise ValueError(f"model_file: {model_file} is not inside {registry_dir}") from None
    rows = dataset.x_test
    latency: dict[int, float] = {}
    for size in sorted(set(batch_sizes)):
        batch = np.resize(rows, (size, rows.shape[1]))
        latency[size] = _median_s(partial(variant.predict_proba, batch), repeats, WARMUP_CALLS)
    load_s = _median_s(lambda: load_variant(model_file), max(1, min(repeats, 5)), 1)
    accuracy, recall = evaluate(variant, dataset)
    return VariantProfile(
        latency_s={worker_type: latency},
        memory_bytes=variant.memory_bytes(),
        load_s=load_s,
        accuracy=accuracy,
        recall=recall,
        model_file=relative,
    )


def build_registry(
    out_dir: Path,
    seed: int = 0,
    repeats: int = 20,
    *,
    applications: Sequence[str] = DATASET_NAMES,
    variants: Sequence[str] | None = None,
    worker_type: str = WORKER_TYPE,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    deadline_s: float = DEFAULT_DEADLINE_S,
    on_variant: Callable[[str, str], None] | None = None,
) -> Registry:
    """Train, save and profile every variant of every application; return the registry.

    Model files go to ``out_dir/<application>/``; their paths in the registry are
    relative to ``out_dir`` (where :func:`~switchyard.apps.registry_file.save_registry`
    should put ``registry.json``). The registry itself is not written.

    Args:
        out_dir: the folder for the model files (created when missing).
        seed: the training seed.
        repeats: timed calls per batch size.
        applications: which datasets to build (default all three).
        variants: which variants to build (default: each application's own set,
            ``DatasetSpec.variants``).
        worker_type, batch_sizes: as for :func:`profile_variant`.
        deadline_s: every application's deadline.
        on_variant: called with ``(application, variant)`` after each is profiled.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    apps: list[Application] = []
    for name in applications:
        dataset = load_dataset(name)
        names = DATASET_SPECS[name].variants if variants is None else variants
        files = train_application(dataset, out_dir, seed, names)
        profiles: dict[str, VariantProfile] = {}
        for variant_name, path in files.items():
            variant = load_variant(path)
            profiles[variant_name] = profile_variant(
                variant,
                dataset,
                worker_type,
                batch_sizes,
                repeats,
                model_file=path,
                registry_dir=out_dir,
            )
            if on_variant is not None:
                on_variant(name, variant_name)
        apps.append(
            Application(
                name=dataset.name,
                classes=dataset.class_names,
                deadline_s=deadline_s,
                penalty=DEFAULT_PENALTY,
                prior=PriorSpec(kind="jeffreys"),
                stream_class_mix=dataset.default_stream_mix,
                dataset=dataset.name,
                feature_dim=dataset.feature_dim,
                variants=profiles,
            )
        )
    return Registry(applications=tuple(apps))
