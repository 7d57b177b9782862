"""The classifier runner: the registry's classification variants, run for real.

Every classification application of the serving catalogue is servable; a model is
``app/variant`` and loads from the registry folder through the model cache
(:func:`switchyard.apps.variants.load_variant`), its measured load time being the
swap-in cost. A batch holds requests of one application and variant; their feature
vectors go through one ``predict_proba`` call in a thread. A request whose feature
vector has the wrong length fails alone, with the expected and actual lengths; the rest
of its batch is answered.

Variants predict on the CPU (their ``predict_proba`` takes numpy arrays on the host), so
their completions say ``cpu`` even on a CUDA worker; queue estimates use the profiled
latencies of that worker type.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import numpy as np
from switchyard.apps.registry import VariantProfile
from switchyard.apps.variants import Variant, VariantFileError, load_variant
from switchyard.contracts.messages import Assignment, ClassificationPayload, ClassificationResult
from switchyard.serving import ServingCatalogue, UnknownServedApplicationError

from services.worker.backends.base import ExecutionSink, UnsupportedWorkError, WorkSpec
from services.worker.model_cache import ModelCache, ModelCacheError
from services.worker.queue import BatchKey, WorkItem

CLASSIFIER_WORKER_TYPE = "cpu"


def model_key(app: str, variant: str) -> str:
    """The served-model name of one application's variant: ``app/variant``."""
    return f"{app}/{variant}"


class ClassifierRunner:
    """Serves every classification variant of ``catalogue`` through ``cache``.

    Args:
        catalogue: the serving catalogue; its ``registry_dir`` holds the model files.
        cache: the worker's model cache.
        max_batch: the largest batch the worker runs (for queue estimates).
    """

    def __init__(self, catalogue: ServingCatalogue, cache: ModelCache, max_batch: int) -> None:
        self.catalogue = catalogue
        self.cache = cache
        self.max_batch = max_batch
        self._models = {
            model_key(app.name, variant): (app.name, variant)
            for app in catalogue.classification.values()
            for variant in app.variants
        }

    def servable_models(self) -> list[str]:
        return list(self._models)

    def owns(self, key: BatchKey) -> bool:
        return key.model in self._models

    def _profile(self, key: BatchKey) -> VariantProfile:
        app, variant = self._models[key.model]
        return self.catalogue.classification[app].spec.variants[variant]

    def describe(self, assignment: Assignment) -> WorkSpec:
        request = assignment.request
        if not isinstance(request.payload, ClassificationPayload):
            raise UnsupportedWorkError(
                f"application {request.app!r} is not a classification application here"
            )
        try:
            app = self.catalogue.classification_application(request.app)
        except UnknownServedApplicationError as exc:
            raise UnsupportedWorkError(str(exc)) from None
        if assignment.variant not in app.variants:
            raise UnsupportedWorkError(
                f"application {app.name!r} has no variant {assignment.variant!r}; "
                f"its variants: {', '.join(app.variants)}"
            )
        if self.catalogue.registry_dir is None:
            raise UnsupportedWorkError(
                "the serving catalogue was built without a registry folder: no model files"
            )
        key = BatchKey(model_key(app.name, assignment.variant), assignment.variant)
        return WorkSpec(key=key, estimate_s=self._batch_s(key, 1))

    def _batch_s(self, key: BatchKey, size: int) -> float:
        """Profiled seconds of one batch of ``size``: the smallest profiled batch size that
        holds it (the largest when none does), plus the load time when not resident."""
        profile = self._profile(key)
        by_batch = profile.latency_s.get(CLASSIFIER_WORKER_TYPE) or next(
            iter(profile.latency_s.values())
        )
        sizes = sorted(by_batch)
        fitting = [s for s in sizes if s >= size]
        latency_s = by_batch[fitting[0] if fitting else sizes[-1]]
        load_s = 0.0 if self.cache.is_resident(key.model) else profile.load_s
        return latency_s + load_s

    def estimate_batch_s(self, items: Sequence[WorkItem]) -> float:
        """Profiled seconds to serve ``items`` (all of one key) in batches of ``max_batch``."""
        if not items:
            return 0.0
        batches = math.ceil(len(items) / self.max_batch)
        return batches * self._batch_s(items[0].key, min(len(items), self.max_batch))

    def decode_step_s(self) -> float:
        return 0.0  # a classifier has no decode steps

    def _loader(self, key: BatchKey) -> tuple[Variant, int]:
        registry_dir = self.catalogue.registry_dir
        if registry_dir is None:  # describe() let no such request in
            raise VariantFileError("no registry folder")
        variant = load_variant(self._profile(key).model_path(registry_dir))
        return variant, variant.memory_bytes()

    async def run(self, batch: list[WorkItem], sink: ExecutionSink) -> None:
        """Classify ``batch`` (one key) with one ``predict_proba`` call."""
        key = batch[0].key
        app_name, _ = self._models[key.model]
        await sink.started(batch)
        for item in batch:
            item.ran_on = CLASSIFIER_WORKER_TYPE
        try:
            async with self.cache.use(
                key.model,
                lambda: self._loader(key),
                size_hint_bytes=self._profile(key).memory_bytes,
            ) as variant:
                good: list[WorkItem] = []
                rows: list[list[float]] = []
                for item in batch:
                    payload = item.request.payload
                    assert isinstance(payload, ClassificationPayload)  # checked by describe()
                    if len(payload.features) != variant.input_dim:
                        await sink.failed(
                            item,
                            f"application {app_name!r} expects {variant.input_dim} features, "
                            f"got {len(payload.features)}",
                        )
                        continue
                    good.append(item)
                    rows.append(payload.features)
                if not good:
                    return
                features = np.asarray(rows, dtype=np.float64)
                probabilities = await asyncio.to_thread(variant.predict_proba, features)
        except (ModelCacheError, VariantFileError) as exc:
            for item in batch:
                await sink.failed(item, f"cannot load {key.model}: {exc}")
            return
        for item, row in zip(good, probabilities, strict=True):
            values = [max(0.0, float(p)) for p in row]
            label = int(np.argmax(row))
            await sink.finished(item, ClassificationResult(label=label, probabilities=values))
