"""Trace input for the simulator and the load generator.

Every source yields a :class:`Trace`: named, sorted by arrival, the first request at
0.0 s, with a ``source`` that says which file or generator it came from.

- :mod:`switchyard.traces.azure`: the Azure LLM inference trace reader (strict; errors name
  the file, line and field) and the bundled samples.
- :mod:`switchyard.traces.mooncake`: the Mooncake-format reader (JSON lines with the
  prompt's KV-block ids, so shared prefixes are known).
- :mod:`switchyard.traces.synthetic`: seeded Poisson, bursty (MMPP-2) and diurnal arrivals
  with resampled or lognormal lengths.
- :mod:`switchyard.traces.transform`: scale the load, cut a time window, take the head,
  interleave.
- :mod:`switchyard.traces.sources`: :func:`resolve_trace` turns one spec string
  (``azure-conv``, ``poisson:rate_rps=8``, a CSV path) into a trace.
"""

from switchyard.traces.azure import (
    BUNDLED_SAMPLES,
    PREFIX_BLOCK_TOKENS,
    Trace,
    TraceFormatError,
    TraceRequest,
    bundled_mix,
    bundled_sample,
    load_azure_trace,
    read_azure_trace,
)
from switchyard.traces.mooncake import load_mooncake_trace
from switchyard.traces.sources import TraceSpecError, resolve_trace, trace_help, trace_names
from switchyard.traces.synthetic import (
    LengthSampler,
    LognormalLengths,
    ResampledLengths,
    bursty,
    diurnal,
    poisson,
)
from switchyard.traces.transform import head, interleave, scale_load, window

__all__ = [
    "BUNDLED_SAMPLES",
    "PREFIX_BLOCK_TOKENS",
    "LengthSampler",
    "LognormalLengths",
    "ResampledLengths",
    "Trace",
    "TraceFormatError",
    "TraceRequest",
    "TraceSpecError",
    "bundled_mix",
    "bundled_sample",
    "bursty",
    "diurnal",
    "head",
    "interleave",
    "load_azure_trace",
    "load_mooncake_trace",
    "poisson",
    "read_azure_trace",
    "resolve_trace",
    "scale_load",
    "trace_help",
    "trace_names",
    "window",
]
