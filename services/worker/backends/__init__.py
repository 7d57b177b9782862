"""Execution backends of a worker, behind one interface (:class:`Backend`).

- ``emulated-llm`` (:class:`EmulatedLlmBackend`): continuous batching that spends the
  time a performance model gives for a named GPU and model; an emulation, labelled so.
- ``torch`` (:class:`StaticBatchBackend` over the classifier and tiny-LM runners): real
  models, on CPU or CUDA.
- ``emulated-models`` (:class:`EmulatedModelsBackend`): pipeline stages of the
  catalogue's multi-model models, on the models the placement service places here,
  spending their modelled load and service times; an emulation, labelled so.

Importing this package does not import torch: the tiny language model's module is
imported by :func:`build_backend` only when a torch backend is asked for.
"""

from __future__ import annotations

import asyncio
import dataclasses

from switchyard.config import Settings
from switchyard.errors import ConfigError
from switchyard.multimodel.model import ResourceVector
from switchyard.perf import performance_model
from switchyard.serving import ServingCatalogue

from services.worker.backends.base import (
    Backend,
    BackendLoad,
    ExecutionSink,
    Preemption,
    Result,
    UnsupportedWorkError,
    WorkSpec,
)
from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.backends.emulated_models import EmulatedModelsBackend
from services.worker.backends.static import StaticBatchBackend, StaticRunner

__all__ = [
    "Backend",
    "BackendLoad",
    "EmulatedLlmBackend",
    "EmulatedModelsBackend",
    "ExecutionSink",
    "Preemption",
    "Result",
    "StaticBatchBackend",
    "StaticRunner",
    "UnsupportedWorkError",
    "WorkSpec",
    "build_backend",
    "build_backend_for",
    "build_emulated_models_backend",
    "build_torch_backend",
]


def build_torch_backend(settings: Settings, catalogue: ServingCatalogue) -> StaticBatchBackend:
    """The torch backend: every classification variant of ``catalogue`` and the tiny
    language model, sharing one model cache of ``settings.worker_memory_bytes``."""
    from services.worker.backends.classifier import ClassifierRunner
    from services.worker.backends.torch_lm import TinyLmRunner, resolve_device
    from services.worker.model_cache import ModelCache

    device = resolve_device(settings.worker_device)
    cache = ModelCache(settings.worker_memory_bytes)
    runners: list[StaticRunner] = [
        ClassifierRunner(catalogue, cache, settings.worker_max_batch),
        TinyLmRunner(cache, device),
    ]
    return StaticBatchBackend(
        runners, cache, worker_type=device, max_batch=settings.worker_max_batch
    )


def build_emulated_models_backend(
    settings: Settings, catalogue: ServingCatalogue
) -> EmulatedModelsBackend:
    """The emulated-models backend: ``catalogue.models`` on a worker of
    ``settings.worker_cpu_cores``, ``worker_gpus`` and ``worker_host_mem_gib``, at
    ``worker_speed``, reporting ``worker_gpu_type``."""
    return EmulatedModelsBackend(
        settings.worker_id or settings.instance_id,
        catalogue.models,
        ResourceVector(
            settings.worker_cpu_cores, settings.worker_gpus, settings.worker_host_mem_gib
        ),
        speed=settings.worker_speed,
        gpu_type=settings.worker_gpu_type,
        time_scale=settings.worker_time_scale,
    )


def build_backend(settings: Settings, catalogue: ServingCatalogue | None) -> Backend:
    """The backend ``settings.worker_backend`` names.

    Raises:
        UnknownProfileError: an emulated backend's ``worker_profile`` is not a profile.
        ConfigError: a chunked-prefill budget below the emulated profile's batch slots, or
            a prefill or decode role on another backend.
        ValueError: a torch or emulated-models backend without a catalogue.
    """
    if settings.worker_role != "mixed" and settings.worker_backend != "emulated-llm":
        raise ConfigError(
            f"SWITCHYARD_WORKER_ROLE={settings.worker_role}: prefill/decode disaggregation "
            f"needs the emulated-llm backend, not {settings.worker_backend}"
        )
    if settings.worker_backend == "emulated-llm":
        perf = performance_model(settings.worker_profile)
        if settings.worker_max_slots is not None:
            # Heartbeats report the cap, so policies see the slots this worker really has.
            slots = min(perf.max_batch_slots, settings.worker_max_slots)
            perf = dataclasses.replace(perf, max_batch_slots=slots)
        chunked = settings.worker_chunked_prefill_tokens
        problem = None if chunked is None else perf.chunk_budget_problem(chunked)
        if problem is not None:
            raise ConfigError(f"SWITCHYARD_WORKER_CHUNKED_PREFILL_TOKENS: {problem}")
        return EmulatedLlmBackend(
            perf, time_scale=settings.worker_time_scale, chunked_prefill_tokens=chunked
        )
    if catalogue is None:
        raise ValueError(f"a {settings.worker_backend} worker needs the serving catalogue")
    if settings.worker_backend == "emulated-models":
        return build_emulated_models_backend(settings, catalogue)
    return build_torch_backend(settings, catalogue)


async def build_backend_for(settings: Settings, catalogue: ServingCatalogue | None) -> Backend:
    """The backend ``settings`` ask for, built off the event loop (importing torch and
    reading the registry take a while). A torch or emulated-models backend without
    ``catalogue`` loads it (``SWITCHYARD_REGISTRY``, or the default registry in the
    cache); an emulated LLM needs none: it serves its profile's model."""
    if settings.worker_backend == "emulated-models" and catalogue is None:
        from switchyard.serving.artifacts import settings_catalogue

        catalogue = await asyncio.to_thread(settings_catalogue, settings)
    if settings.worker_backend == "torch" and catalogue is None:
        from switchyard.serving.artifacts import load_catalogue

        catalogue = await asyncio.to_thread(load_catalogue, settings.registry, settings.cache_dir)
    return await asyncio.to_thread(build_backend, settings, catalogue)
