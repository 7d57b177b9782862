"""Trace specs: one string that names where a simulation's or a replay's requests come from.

A spec is one of:

- ``azure-code``, ``azure-conv``: the full Azure trace. The file is looked up in the
  directory named by ``SWITCHYARD_TRACE_DIR`` when that is set (and must be there),
  else in ``<repository root>/../shared/traces/azure`` when that directory exists,
  else the bundled 1,000-request sample stands in (and the trace is then named
  ``azure-code-sample`` / ``azure-conv-sample``). ``Trace.source`` is the file read.
- ``azure-mix``: both full traces interleaved, each looked up as above.
- ``azure-code-sample``, ``azure-conv-sample``: the bundled sample, always.
- ``azure-mix-sample``: both bundled samples interleaved.
- ``poisson:KEY=VALUE,...``, ``bursty:...``, ``diurnal:...``: a synthetic trace from
  :mod:`switchyard.traces.synthetic`; every key has a default, so ``poisson`` alone is
  valid. Besides the generator's own keys all three take ``seed`` (overrides the
  ``seed`` argument), ``lengths`` (a name or path above to resample lengths from, or
  ``lognormal``) and, with ``lengths=lognormal``, ``prompt_median_tokens``,
  ``prompt_sigma``, ``output_median_tokens``, ``output_sigma``, ``workload`` and
  ``max_tokens``.
- ``mooncake``: the Mooncake FAST'25 synthetic trace (3,993 requests with shared
  prefixes, :mod:`switchyard.traces.mooncake`) from
  ``<repository root>/../shared/traces/mooncake`` when it is there, else the bundled
  first 1,000 requests (then named ``mooncake-sample``); ``mooncake-sample``: those,
  always.
- the path of an Azure-format CSV file. Its workload is ``code`` when the file name
  contains "code", ``conversation`` when it contains "conv", else ``other``. A path
  ending in ``.jsonl`` is read as a Mooncake-format trace.

:func:`trace_help` describes all of this, with the defaults, for a command's help.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from switchyard.contracts.messages import WorkloadType
from switchyard.traces.azure import (
    BUNDLED_SAMPLES,
    Trace,
    bundled_sample,
    load_azure_trace,
)
from switchyard.traces.mooncake import load_mooncake_trace
from switchyard.traces.synthetic import (
    LengthSampler,
    LognormalLengths,
    ResampledLengths,
    bursty,
    diurnal,
    poisson,
)
from switchyard.traces.transform import interleave

TRACE_DIR_ENV = "SWITCHYARD_TRACE_DIR"
REPOSITORY_ROOT = Path(__file__).resolve().parents[3]  # shared/switchyard/traces/
# Next to the repository, not in it: the full traces are shared between checkouts and
# too large to version. A packaged install has no such directory and uses the samples.
SHARED_AZURE_DIR = REPOSITORY_ROOT.parent / "shared" / "traces" / "azure"
AZURE_FILES = {
    WorkloadType.CODE: "AzureLLMInferenceTrace_code.csv",
    WorkloadType.CONVERSATION: "AzureLLMInferenceTrace_conv.csv",
}

_FULL = {"azure-code": WorkloadType.CODE, "azure-conv": WorkloadType.CONVERSATION}
_SAMPLES = {"azure-code-sample": WorkloadType.CODE, "azure-conv-sample": WorkloadType.CONVERSATION}

SHARED_MOONCAKE_FILE = (
    REPOSITORY_ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
)
BUNDLED_MOONCAKE_SAMPLE = Path(__file__).resolve().parent / "data" / "mooncake_sample.jsonl"

_RECORDED_NAMES = (
    *_FULL,
    "azure-mix",
    *_SAMPLES,
    "azure-mix-sample",
    "mooncake",
    "mooncake-sample",
)

# Defaults of each generator's own keys; the type of the default is the type of the key.
_GENERATOR_DEFAULTS: dict[str, dict[str, float | int]] = {
    "poisson": {"rate_rps": 8.0, "requests": 2000},
    "bursty": {
        "base_rate_rps": 4.0,
        "burst_rate_rps": 32.0,
        "requests": 2000,
        "mean_base_s": 30.0,
        "mean_burst_s": 5.0,
    },
    "diurnal": {"mean_rate_rps": 8.0, "requests": 2000, "amplitude": 0.5, "period_s": 600.0},
}
# Conversation-like lengths (the medians of the Azure conversation trace).
_LOGNORMAL_DEFAULTS: dict[str, float | int] = {
    "prompt_median_tokens": 1020.0,
    "prompt_sigma": 1.0,
    "output_median_tokens": 129.0,
    "output_sigma": 1.0,
}
_LOGNORMAL_ONLY = (*_LOGNORMAL_DEFAULTS, "workload", "max_tokens")
_COMMON_KEYS = ("seed", "lengths", *_LOGNORMAL_ONLY)


class TraceSpecError(ValueError):
    """A trace spec names nothing known or has a bad parameter; the one-line message says which."""


def trace_names() -> list[str]:
    """The names a spec may use (besides a file path), for help texts and completion."""
    return [*_RECORDED_NAMES, *_GENERATOR_DEFAULTS]


def trace_help() -> str:
    """A few lines describing every kind of spec and each generator's keys with defaults."""

    def keys(defaults: dict[str, float | int]) -> str:
        return ",".join(f"{key}={value:g}" for key, value in defaults.items())

    lines = [
        "azure-code, azure-conv, azure-mix: the full Azure traces "
        f"(${TRACE_DIR_ENV}, else {SHARED_AZURE_DIR}, else the bundled samples)",
        "azure-code-sample, azure-conv-sample, azure-mix-sample: the bundled 1,000-request samples",
        f"mooncake: the Mooncake trace with shared prefixes (from {SHARED_MOONCAKE_FILE.parent}, "
        "else the bundled first 1,000 requests, mooncake-sample)",
    ]
    lines += [f"{name}:{keys(defaults)},seed=0" for name, defaults in _GENERATOR_DEFAULTS.items()]
    lines += [
        "  any generator: lengths=NAME|PATH (resampled, default azure-conv-sample) or "
        f"lengths=lognormal with {keys(_LOGNORMAL_DEFAULTS)},workload=other,max_tokens=N",
        "PATH: an Azure-format CSV (TIMESTAMP,ContextTokens,GeneratedTokens), or a "
        "Mooncake-format .jsonl (timestamp,input_length,output_length,hash_ids)",
    ]
    return "\n".join(lines)


def azure_trace_dir() -> Path | None:
    """Where the full Azure traces are read from, or None when only the samples exist."""
    configured = os.environ.get(TRACE_DIR_ENV, "").strip()
    if configured:
        return Path(configured)
    if SHARED_AZURE_DIR.is_dir():
        return SHARED_AZURE_DIR
    return None


def _full_azure(workload: WorkloadType) -> Trace:
    name = "azure-code" if workload is WorkloadType.CODE else "azure-conv"
    directory = azure_trace_dir()
    if directory is None:
        return bundled_sample(workload)
    # A configured directory without the file is an error, not a silent fallback: a
    # run asked for the full trace must not quietly replay 1,000 requests.
    return load_azure_trace(directory / AZURE_FILES[workload], workload, name=name)


def _workload_of_file(path: Path) -> WorkloadType:
    file_name = path.name.lower()
    if "code" in file_name:
        return WorkloadType.CODE
    if "conv" in file_name:
        return WorkloadType.CONVERSATION
    return WorkloadType.OTHER


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or os.sep in spec or spec.lower().endswith(".csv")


def _unknown(spec: str) -> TraceSpecError:
    return TraceSpecError(
        f"unknown trace {spec!r}; known names: {', '.join(trace_names())} "
        "(generators take :KEY=VALUE,...), or the path of an Azure-format CSV or a "
        "Mooncake-format .jsonl file"
    )


def _resolve_recorded(spec: str) -> Trace | None:
    """The trace a name or file path stands for; None when ``spec`` is neither."""
    if spec in _FULL:
        return _full_azure(_FULL[spec])
    if spec in _SAMPLES:
        return bundled_sample(_SAMPLES[spec])
    if spec == "azure-mix":
        return interleave(spec, [_full_azure(w) for w in BUNDLED_SAMPLES])
    if spec == "azure-mix-sample":
        return interleave(spec, [bundled_sample(w) for w in BUNDLED_SAMPLES])
    if spec == "mooncake" and SHARED_MOONCAKE_FILE.is_file():
        return load_mooncake_trace(SHARED_MOONCAKE_FILE, name="mooncake")
    if spec in ("mooncake", "mooncake-sample"):
        return load_mooncake_trace(BUNDLED_MOONCAKE_SAMPLE, name="mooncake-sample")
    path = Path(spec).expanduser()
    if spec.lower().endswith(".jsonl"):
        return load_mooncake_trace(path)
    if path.exists() or _looks_like_path(spec):
        return load_azure_trace(path, _workload_of_file(path))
    return None


class _Params:
    """The KEY=VALUE parameters of one generator spec, parsed on demand with clear errors."""

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.defaults: dict[str, float | int] = {
            **_GENERATOR_DEFAULTS[kind],
            **_LOGNORMAL_DEFAULTS,
        }
        self.valid_keys = (*_GENERATOR_DEFAULTS[kind], *_COMMON_KEYS)
        self.raw: dict[str, str] = {}
        for item in text.split(",") if text.strip() else []:
            key, equals, value = (part.strip() for part in item.partition("="))
            if not key or not equals:
                raise self.error(f"expected KEY=VALUE, got {item.strip()!r}")
            if key not in self.valid_keys:
                raise self.error(f"unknown key {key!r}")
            if key in self.raw:
                raise self.error(f"{key} is given twice")
            self.raw[key] = value

    def error(self, problem: str) -> TraceSpecError:
        return TraceSpecError(f"{self.kind}: {problem}; valid keys: {', '.join(self.valid_keys)}")

    def _parsed(self, key: str, parse: Callable[[str], float | int], what: str) -> float | int:
        if key not in self.raw:
            return self.defaults[key]
        try:
            return parse(self.raw[key])
        except ValueError:
            raise self.error(f"{key} must be {what}, got {self.raw[key]!r}") from None

    def number(self, key: str) -> float:
        value = float(self._parsed(key, float, "a number"))
        if not math.isfinite(value):
            raise self.error(f"{key} must be a finite number, got {self.raw[key]!r}")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        if key not in self.raw and default is not None:
            return default
        return int(self._parsed(key, int, "an integer"))

    def lengths(self) -> LengthSampler | None:
        source = self.raw.get("lengths")
        if source != "lognormal":
            extra = [key for key in _LOGNORMAL_ONLY if key in self.raw]
            if extra:
                raise self.error(f"{extra[0]} applies only with lengths=lognormal")
        if source is None:
            return None  # the generator's default: the bundled conversation sample
        if source == "lognormal":
            workload_text = self.raw.get("workload", WorkloadType.OTHER.value)
            try:
                workload = WorkloadType(workload_text)
            except ValueError:
                raise self.error(
                    f"workload must be one of {', '.join(w.value for w in WorkloadType)}, "
                    f"got {workload_text!r}"
                ) from None
            max_tokens = self.integer("max_tokens") if "max_tokens" in self.raw else None
            try:
                return LognormalLengths(
                    prompt_median_tokens=self.number("prompt_median_tokens"),
                    prompt_sigma=self.number("prompt_sigma"),
                    output_median_tokens=self.number("output_median_tokens"),
                    output_sigma=self.number("output_sigma"),
                    workload=workload,
                    max_tokens=max_tokens,
                )
            except TraceSpecError:
                raise
            except ValueError as exc:
                raise self.error(str(exc)) from None
        recorded = _resolve_recorded(source)
        if recorded is None:
            raise self.error(
                f"lengths must be lognormal, a trace name ({', '.join(_RECORDED_NAMES)}) "
                f"or a CSV path, got {source!r}"
            )
        return ResampledLengths(recorded)


def _generate(kind: str, text: str, seed: int) -> Trace:
    params = _Params(kind, text)
    seed = params.integer("seed", default=seed)
    lengths = params.lengths()
    requests = params.integer("requests")
    try:
        if kind == "poisson":
            return poisson(params.number("rate_rps"), requests, seed=seed, lengths=lengths)
        if kind == "bursty":
            return bursty(
                params.number("base_rate_rps"),
                params.number("burst_rate_rps"),
                requests,
                mean_base_s=params.number("mean_base_s"),
                mean_burst_s=params.number("mean_burst_s"),
                seed=seed,
                lengths=lengths,
            )
        return diurnal(
            params.number("mean_rate_rps"),
            requests,
            amplitude=params.number("amplitude"),
            period_s=params.number("period_s"),
            seed=seed,
            lengths=lengths,
        )
    except TraceSpecError:
        raise
    except ValueError as exc:  # a value out of range, named by the generator
        raise params.error(str(exc)) from None


def resolve_trace(spec: str, *, seed: int = 0) -> Trace:
    """The trace a spec stands for (see the module documentation for the forms).

    Args:
        spec: a trace name, a generator with its parameters, or a CSV path.
        seed: the seed of a synthetic trace when the spec gives none; ignored otherwise.

    Raises:
        TraceSpecError: an unknown name (the message lists the known ones), or an
            unknown key or bad value of a generator (the message lists the valid keys).
        TraceFormatError: a trace file is missing ("...: no such file") or malformed.
    """
    spec = spec.strip()
    if not spec:
        raise _unknown(spec)
    kind, _, params = spec.partition(":")
    if kind.strip() in _GENERATOR_DEFAULTS:
        return _generate(kind.strip(), params, seed)
    recorded = _resolve_recorded(spec)
    if recorded is None:
        raise _unknown(spec)
    return recorded
