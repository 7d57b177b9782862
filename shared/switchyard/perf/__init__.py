"""Performance models of LLM serving instances, by named GPU and model profile.

``performance_model("a100-80gb/llama-2-7b")`` gives the iteration times (prefill,
decode step) and memory limits (KV-cache tokens, batch slots) that the simulator and
the emulated worker backend use. They come from a documented analytical model with
constants from public datasheets, model cards and published measurements
(``switchyard/perf/data/README.md``), not from measurements of this deployment.
"""

from switchyard.perf.model import PerformanceModel
from switchyard.perf.profiles import (
    EngineSettings,
    GpuData,
    GpuEfficiency,
    GpuProfile,
    ModelData,
    ModelProfile,
    ProfileDataError,
    UnknownProfileError,
    build_performance_model,
    engine_settings,
    gpu_efficiencies,
    gpu_profiles,
    kv_capacity_tokens,
    model_profiles,
    parse_gpus,
    parse_models,
    performance_model,
    profile_names,
)

__all__ = [
    "EngineSettings",
    "GpuData",
    "GpuEfficiency",
    "GpuProfile",
    "ModelData",
    "ModelProfile",
    "PerformanceModel",
    "ProfileDataError",
    "UnknownProfileError",
    "build_performance_model",
    "engine_settings",
    "gpu_efficiencies",
    "gpu_profiles",
    "kv_capacity_tokens",
    "model_profiles",
    "parse_gpus",
    "parse_models",
    "performance_model",
    "profile_names",
]
