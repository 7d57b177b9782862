"""Named GPU and model profiles, and the performance models built from them.

The figures live in ``switchyard/perf/data`` (``gpus.json``, ``models.json``; the
README there gives the source of each one) and are read once per process. A
performance profile is named ``"GPU/MODEL"``, e.g. ``"a100-80gb/llama-2-7b"``; every
pair whose model fits on at most ``max_tensor_parallel`` GPUs of that kind is one.

How a profile becomes a :class:`PerformanceModel` (a roofline-style model: each term
is the time one resource needs at a fixed share of its peak, and the terms add up):

- tensor parallelism ``tp``: pinned per GPU in ``models.json``, or else the smallest
  power of two whose memory holds the weights, a per-GPU reserve (activations, CUDA
  graphs, workspaces) and still leaves ``min_kv_fraction`` of it, and more than one
  prefill budget of tokens, for the KV cache;
- ``kv_capacity_tokens = (tp * memory * gpu_memory_utilization - weights
  - tp * reserve) / kv_bytes_per_token``;
- reading the weights once, ``weight_bytes / (tp * bandwidth * bandwidth_efficiency)``,
  is the bulk of a decode step's fixed cost, and also of a prefill's (a prefill of one
  token costs about a decode step); the engine's per-iteration overhead is added to both;
- the linear layers cost ``2 * parameters`` FLOPs per token, at ``tp * peak * mfu``;
- causal attention over a prompt of ``p`` tokens costs ``2 * layers * hidden * p^2``
  FLOPs (the per-token-squared prefill term);
- a decode step reads every cached token's keys and values once:
  ``kv_bytes_per_token / (tp * bandwidth * bandwidth_efficiency)`` per token;
- with ``tp > 1`` every layer all-reduces its activations twice: a latency per step and
  ``2 (tp - 1) / tp`` times the activation bytes per token over the GPU-to-GPU link;
- KV-cache migration uses every GPU's own network adapter: ``tp * interconnect``.

Adding the terms instead of taking the larger one overestimates where two are close
(by at most the smaller, e.g. about 10 % for a 1,000-token Llama-2-7B prefill), but
keeps every iteration time linear in tokens and batch size, which the simulator needs.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

from switchyard.errors import SwitchyardError
from switchyard.perf.model import PerformanceModel

GPUS_FILE = "gpus.json"
MODELS_FILE = "models.json"


class UnknownProfileError(SwitchyardError, ValueError):
    """A performance profile name that is not one of :func:`profile_names`."""


class ProfileDataError(SwitchyardError, ValueError):
    """A profile data file is malformed; the message names the file and the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProfile:
    """Datasheet figures of one GPU type.

    Attributes:
        name: e.g. ``"a100-80gb"``.
        memory_bytes: device memory.
        peak_dense_bf16_flops: dense (no sparsity) BF16 tensor-core peak, FLOP/s.
        hbm_bandwidth_bytes_per_s: peak device-memory bandwidth.
        interconnect_bytes_per_s: network bandwidth of one GPU towards another
            instance, used for KV-cache transfer on migration.
        sources: where the figures come from.
    """

    name: str
    memory_bytes: int
    peak_dense_bf16_flops: float
    hbm_bandwidth_bytes_per_s: float
    interconnect_bytes_per_s: float
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuEfficiency:
    """How much of a GPU's peaks a serving engine reaches, and its tensor-parallel link.

    Attributes:
        prefill_mfu: share of peak FLOP/s a prefill reaches.
        decode_mfu: share of peak FLOP/s for the per-sequence GEMM work of a decode step.
        decode_bandwidth_efficiency: share of peak memory bandwidth a decode step reaches.
        tensor_parallel_link_bytes_per_s: GPU-to-GPU bandwidth each way (NVLink or PCIe).
        allreduce_latency_s: fixed latency of one small all-reduce between the GPUs.
    """

    prefill_mfu: float
    decode_mfu: float
    decode_bandwidth_efficiency: float
    tensor_parallel_link_bytes_per_s: float
    allreduce_latency_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """Settings and costs of the serving engine, the same on every GPU.

    Attributes:
        gpu_memory_utilization: share of each GPU's memory the engine uses.
        max_batch_slots: continuous-batching slots (vLLM's ``max_num_seqs``).
        max_batched_tokens: prompt-token budget of one prefill iteration.
        kv_block_tokens: tokens per KV-cache block; each running sequence holds one at least.
        min_kv_fraction: share of memory that must be left for KV cache.
        max_tensor_parallel: the most GPUs one instance may span.
        reserve_bytes_per_gpu: memory outside weights and KV cache, per GPU.
        step_overhead_s: fixed cost of every iteration.
        per_seq_overhead_s: per-sequence cost of every decode step beyond the GEMMs.
        sources: where the figures come from.
    """

    gpu_memory_utilization: float
    max_batch_slots: int
    max_batched_tokens: int
    kv_block_tokens: int
    min_kv_fraction: float
    max_tensor_parallel: int
    reserve_bytes_per_gpu: int
    step_overhead_s: float
    per_seq_overhead_s: float
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelProfile:
    """Architecture figures of one decoder-only transformer.

    Attributes:
        name: e.g. ``"llama-2-7b"``.
        parameters: weights in the checkpoint.
        layers: transformer blocks.
        hidden_size: model width (also the width of the query projection).
        kv_heads: key/value heads (fewer than the query heads with grouped-query attention).
        head_dim: width of one attention head.
        bytes_per_param: 2 for fp16/bf16 weights and KV cache.
        sources: where the figures come from.
    """

    name: str
    parameters: int
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int
    sources: tuple[str, ...]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token: keys and values of every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights."""
        return self.parameters * self.bytes_per_param

    @property
    def attention_heads(self) -> int:
        """Query heads."""
        return self.hidden_size // self.head_dim


@dataclass(frozen=True, slots=True)
class GpuData:
    """The contents of ``gpus.json``."""

    gpus: Mapping[str, GpuProfile]
    efficiencies: Mapping[str, GpuEfficiency]
    engine: EngineSettings


@dataclass(frozen=True, slots=True)
class ModelData:
    """The contents of ``models.json``: the models and the tensor parallelism pinned per GPU."""

    models: Mapping[str, ModelProfile]
    tensor_parallel: Mapping[str, Mapping[str, int]]


# -- building a performance model ------------------------------------------------------


def kv_capacity_tokens(
    gpu: GpuProfile, model: ModelProfile, engine: EngineSettings, tensor_parallel: int
) -> int | None:
    """KV-cache tokens of one instance, or ``None`` when the model does not fit.

    It fits when the attention heads split evenly over the GPUs, the memory left after
    the weights and the reserve is at least ``min_kv_fraction`` of the instance's
    memory, and it holds more than one prefill budget of tokens.
    """
    tp = tensor_parallel
    if model.attention_heads % tp or model.kv_heads % tp:
        return None
    memory = tp * gpu.memory_bytes
    free_bytes = (
        memory * engine.gpu_memory_utilization
        - model.weight_bytes
        - tp * engine.reserve_bytes_per_gpu
    )
    if free_bytes < engine.min_kv_fraction * memory:
        return None
    tokens = int(free_bytes // model.kv_bytes_per_token)
    return tokens if tokens > engine.max_batched_tokens else None


def build_performance_model(
    *,
    gpu: GpuProfile,
    model: ModelProfile,
    efficiency: GpuEfficiency,
    engine: EngineSettings,
    tensor_parallel: int | None = None,
) -> PerformanceModel:
    """The performance model of ``model`` served on ``gpu`` (see the module docstring).

    Raises:
        ValueError: the model does not fit with the given tensor parallelism, or with
            any power of two up to ``engine.max_tensor_parallel``.
    """
    name = f"{gpu.name}/{model.name}"
    if tensor_parallel is None:
        tp = 1
        capacity = kv_capacity_tokens(gpu, model, engine, tp)
        while capacity is None and tp < engine.max_tensor_parallel:
            tp *= 2
            capacity = kv_capacity_tokens(gpu, model, engine, tp)
        if capacity is None:
            raise ValueError(
                f"{name}: the model does not fit on up to {engine.max_tensor_parallel} GPUs"
            )
    else:
        tp = tensor_parallel
        capacity = kv_capacity_tokens(gpu, model, engine, tp)
        if capacity is None:
            raise ValueError(f"{name}: the model does not fit with tensor parallelism {tp}")

    bandwidth = tp * gpu.hbm_bandwidth_bytes_per_s * efficiency.decode_bandwidth_efficiency
    prefill_flops = tp * gpu.peak_dense_bf16_flops * efficiency.prefill_mfu
    decode_flops = tp * gpu.peak_dense_bf16_flops * efficiency.decode_mfu
    linear_flops_per_token = 2.0 * model.parameters
    weights_read_s = model.weight_bytes / bandwidth
    if tp > 1:
        # Megatron-style tensor parallelism: two all-reduces of the activations per layer.
        allreduces = 2 * model.layers
        sync_s = allreduces * efficiency.allreduce_latency_s
        ring_bytes_per_token = (
            allreduces * model.hidden_size * model.bytes_per_param * 2.0 * (tp - 1) / tp
        )
        allreduce_per_token_s = ring_bytes_per_token / efficiency.tensor_parallel_link_bytes_per_s
    else:
        sync_s = 0.0
        allreduce_per_token_s = 0.0
    fixed_s = engine.step_overhead_s + weights_read_s + sync_s

    sources: dict[str, None] = dict.fromkeys((*gpu.sources, *engine.sources, *model.sources))
    return PerformanceModel(
        name=name,
        gpu=gpu.name,
        model=model.name,
        tensor_parallel=tp,
        max_batch_slots=min(engine.max_batch_slots, capacity // engine.kv_block_tokens),
        max_batched_tokens=engine.max_batched_tokens,
        kv_capacity_tokens=capacity,
        kv_bytes_per_token=model.kv_bytes_per_token,
        interconnect_bytes_per_s=tp * gpu.interconnect_bytes_per_s,
        prefill_base_s=fixed_s,
        prefill_per_token_s=linear_flops_per_token / prefill_flops + allreduce_per_token_s,
        prefill_per_token_sq_s=2.0 * model.layers * model.hidden_size / prefill_flops,
        decode_base_s=fixed_s,
        decode_per_seq_s=(
            linear_flops_per_token / decode_flops
            + engine.per_seq_overhead_s
            + allreduce_per_token_s
        ),
        decode_per_kv_token_s=model.kv_bytes_per_token / bandwidth,
        sources=tuple(sources),
    )


# -- reading the data files ------------------------------------------------------------


class _Fields:
    """Typed access to one JSON object, with errors naming the file and the field."""

    def __init__(self, source: str, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise ProfileDataError(f"{source}: field '{path}' must be a JSON object")
        self.source = source
        self.path = path
        self.value: dict[str, object] = value

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str) -> ProfileDataError:
        return ProfileDataError(f"{self.source}: field '{self._name(key)}' {problem}")

    def get(self, key: str) -> object:
        if key not in self.value:
            raise self.fail(key, "is missing")
        return self.value[key]

    def only(self, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        for key in required:
            self.get(key)
        unknown = sorted(set(self.value) - set(required) - set(optional))
        if unknown:
            raise self.fail(unknown[0], "is not a known field (a typo?)")

    def child(self, key: str) -> _Fields:
        return _Fields(self.source, self.get(key), self._name(key))

    def integer(self, key: str, *, minimum: int = 1) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def number(self, key: str, *, share: bool = False, allow_zero: bool = False) -> float:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {value!r}")
        number = float(value)
        if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
            bound = "non-negative" if allow_zero else "positive"
            raise self.fail(key, f"must be a {bound} number, got {value!r}")
        if share and number > 1:
            raise self.fail(key, f"is a share and must be at most 1, got {value!r}")
        return number

    def sources(self, key: str = "sources") -> tuple[str, ...]:
        value = self.get(key)
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(item, str) and item.strip() for item in value)
        ):
            raise self.fail(key, "must be a non-empty list of citations (strings)")
        return tuple(value)


def _power_of_two(fields: _Fields, key: str) -> int:
    value = fields.integer(key)
    if value & (value - 1):
        raise fields.fail(key, f"must be a power of two, got {value}")
    return value


def _entries(fields: _Fields, key: str) -> dict[str, _Fields]:
    table = fields.child(key)
    if not table.value:
        raise fields.fail(key, "must name at least one entry")
    entries: dict[str, _Fields] = {}
    for name in table.value:
        if not name or "/" in name or name != name.strip():
            raise table.fail(name, "is not a usable name (empty, padded or containing '/')")
        entries[name] = table.child(name)
    return entries


def parse_gpus(document: object, source: str = GPUS_FILE) -> GpuData:
    """Validate the parsed contents of ``gpus.json``.

    Raises:
        ProfileDataError: a field is missing or wrong; the message names ``source`` and it.
    """
    root = _Fields(source, document, "")
    root.only(("engine", "gpus"), ("description",))
    section = root.child("engine")
    section.only(
        (
            "gpu_memory_utilization",
            "max_batch_slots",
            "max_batched_tokens",
            "kv_block_tokens",
            "min_kv_fraction",
            "max_tensor_parallel",
            "reserve_bytes_per_gpu",
            "step_overhead_s",
            "per_seq_overhead_s",
            "sources",
        ),
        ("notes",),
    )
    engine = EngineSettings(
        gpu_memory_utilization=section.number("gpu_memory_utilization", share=True),
        max_batch_slots=section.integer("max_batch_slots"),
        max_batched_tokens=section.integer("max_batched_tokens"),
        kv_block_tokens=section.integer("kv_block_tokens"),
        min_kv_fraction=section.number("min_kv_fraction", share=True, allow_zero=True),
        max_tensor_parallel=_power_of_two(section, "max_tensor_parallel"),
        reserve_bytes_per_gpu=section.integer("reserve_bytes_per_gpu", minimum=0),
        step_overhead_s=section.number("step_overhead_s", allow_zero=True),
        per_seq_overhead_s=section.number("per_seq_overhead_s", allow_zero=True),
        sources=section.sources(),
    )
    gpus: dict[str, GpuProfile] = {}
    efficiencies: dict[str, GpuEfficiency] = {}
    for name, entry in _entries(root, "gpus").items():
        entry.only(
            (
                "memory_bytes",
                "peak_dense_bf16_flops",
                "hbm_bandwidth_bytes_per_s",
                "interconnect_bytes_per_s",
                "efficiency",
                "sources",
            ),
            ("notes",),
        )
        gpus[name] = GpuProfile(
            name=name,
            memory_bytes=entry.integer("memory_bytes"),
            peak_dense_bf16_flops=entry.number("peak_dense_bf16_flops"),
            hbm_bandwidth_bytes_per_s=entry.number("hbm_bandwidth_bytes_per_s"),
            interconnect_bytes_per_s=entry.number("interconnect_bytes_per_s"),
            sources=entry.sources(),
        )
        eff = entry.child("efficiency")
        eff.only(
            (
                "prefill_mfu",
                "decode_mfu",
                "decode_bandwidth_efficiency",
                "tensor_parallel_link_bytes_per_s",
                "allreduce_latency_s",
            )
        )
        efficiencies[name] = GpuEfficiency(
            prefill_mfu=eff.number("prefill_mfu", share=True),
            decode_mfu=eff.number("decode_mfu", share=True),
            decode_bandwidth_efficiency=eff.number("decode_bandwidth_efficiency", share=True),
            tensor_parallel_link_bytes_per_s=eff.number("tensor_parallel_link_bytes_per_s"),
            allreduce_latency_s=eff.number("allreduce_latency_s", allow_zero=True),
        )
    return GpuData(MappingProxyType(gpus), MappingProxyType(efficiencies), engine)


def parse_models(document: object, source: str = MODELS_FILE) -> ModelData:
    """Validate the parsed contents of ``models.json``.

    Raises:
        ProfileDataError: a field is missing or wrong; the message names ``source`` and it.
    """
    root = _Fields(source, document, "")
    root.only(("models",), ("description",))
    models: dict[str, ModelProfile] = {}
    pinned: dict[str, Mapping[str, int]] = {}
    for name, entry in _entries(root, "models").items():
        entry.only(
            (
                "parameters",
                "layers",
                "hidden_size",
                "kv_heads",
                "head_dim",
                "bytes_per_param",
                "sources",
            ),
            ("tensor_parallel", "notes"),
        )
        model = ModelProfile(
            name=name,
            parameters=entry.integer("parameters"),
            layers=entry.integer("layers"),
            hidden_size=entry.integer("hidden_size"),
            kv_heads=entry.integer("kv_heads"),
            head_dim=entry.integer("head_dim"),
            bytes_per_param=entry.integer("bytes_per_param"),
            sources=entry.sources(),
        )
        if model.hidden_size % model.head_dim:
            raise entry.fail("head_dim", "must divide hidden_size")
        if model.attention_heads % model.kv_heads:
            raise entry.fail("kv_heads", "must divide the query heads (hidden_size / head_dim)")
        models[name] = model
        if "tensor_parallel" in entry.value:
            table = entry.child("tensor_parallel")
            pinned[name] = MappingProxyType({gpu: _power_of_two(table, gpu) for gpu in table.value})
    return ModelData(MappingProxyType(models), MappingProxyType(pinned))


def _read_json(filename: str) -> tuple[object, str]:
    resource = resources.files("switchyard.perf") / "data" / filename
    source = str(resource)
    try:
        text = resource.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileDataError(f"{source}: cannot be read: {exc}") from exc
    try:
        return json.loads(text), source
    except json.JSONDecodeError as exc:
        raise ProfileDataError(f"{source}: not valid JSON: {exc}") from exc


@dataclass(frozen=True, slots=True)
class _Catalog:
    gpu_data: GpuData
    model_data: ModelData
    performance: Mapping[str, PerformanceModel]


@functools.cache
def _catalog() -> _Catalog:
    gpu_document, gpu_source = _read_json(GPUS_FILE)
    gpu_data = parse_gpus(gpu_document, gpu_source)
    model_document, model_source = _read_json(MODELS_FILE)
    model_data = parse_models(model_document, model_source)
    performance: dict[str, PerformanceModel] = {}
    for model_name, model in model_data.models.items():
        pinned = model_data.tensor_parallel.get(model_name, {})
        for gpu_name in pinned:
            if gpu_name not in gpu_data.gpus:
                raise ProfileDataError(
                    f"{model_source}: field 'models.{model_name}.tensor_parallel.{gpu_name}' "
                    f"names an unknown GPU (known: {', '.join(sorted(gpu_data.gpus))})"
                )
        for gpu_name, gpu in gpu_data.gpus.items():
            try:
                built = build_performance_model(
                    gpu=gpu,
                    model=model,
                    efficiency=gpu_data.efficiencies[gpu_name],
                    engine=gpu_data.engine,
                    tensor_parallel=pinned.get(gpu_name),
                )
            except ValueError as exc:
                if gpu_name in pinned:
                    # A pinned degree that does not fit is a mistake in the data, not
                    # a combination to leave out quietly.
                    raise ProfileDataError(
                        f"{model_source}: field 'models.{model_name}.tensor_parallel."
                        f"{gpu_name}': {exc}"
                    ) from exc
                continue
            performance[built.name] = built
    ordered = {name: performance[name] for name in sorted(performance)}
    return _Catalog(gpu_data, model_data, MappingProxyType(ordered))


# -- the public registry ---------------------------------------------------------------


def gpu_profiles() -> Mapping[str, GpuProfile]:
    """Every GPU profile by name (read once from ``data/gpus.json``)."""
    return _catalog().gpu_data.gpus


def gpu_efficiencies() -> Mapping[str, GpuEfficiency]:
    """The serving efficiency of every GPU profile, by GPU name."""
    return _catalog().gpu_data.efficiencies


def engine_settings() -> EngineSettings:
    """The serving-engine settings every profile shares."""
    return _catalog().gpu_data.engine


def model_profiles() -> Mapping[str, ModelProfile]:
    """Every model profile by name (read once from ``data/models.json``)."""
    return _catalog().model_data.models


def profile_names() -> list[str]:
    """Every valid ``"GPU/MODEL"`` performance profile name, sorted."""
    return list(_catalog().performance)


def performance_model(name: str) -> PerformanceModel:
    """The performance model of a ``"GPU/MODEL"`` profile (built once, then shared).

    Raises:
        UnknownProfileError: ``name`` is not one of :func:`profile_names`; the message
            lists them.
    """
    performance = _catalog().performance
    try:
        return performance[name]
    except KeyError:
        raise UnknownProfileError(
            f"unknown performance profile {name!r}: known profiles are {', '.join(performance)}"
        ) from None
