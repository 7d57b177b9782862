"""Trace input for the simulator and the load generator.

Every source yields a :class:`Trace`: named, sorted by arrival, the first request at
0.0 s, with a ``source`` that says which file or generator it came from.

- :mod:`loadgen.traces.azure`: the Azure LLM inference trace reader (strict; errors name
  the file, line and field) and the bundled samples.
- :mod:`loadgen.traces.synthetic`: seeded Poisson, bursty (MMPP-2) and diurnal arrivals
  with resampled or lognormal lengths.
- :mod:`loadgen.traces.transform`: scale the load, cut a time window, take the head,
  interleave.
- :mod:`loadgen.traces.sources`: :func:`resolve_trace` turns one spec string
  (``azure-conv``, ``poisson:rate_rps=8``, a CSV path) into a trace.
"""

from loadgen.traces.azure import (
    BUNDLED_SAMPLES,
    Trace,
    TraceFormatError,
    TraceRequest,
    bundled_mix,
    bundled_sample,
    load_azure_trace,
    read_azure_trace,
)
from loadgen.traces.sources import TraceSpecError, resolve_trace, trace_help, trace_names
from loadgen.traces.synthetic import (
    LengthSampler,
    LognormalLengths,
    ResampledLengths,
    bursty,
    diurnal,
    poisson,
)
from loadgen.traces.transform import head, interleave, scale_load, window

__all__ = [
    "BUNDLED_SAMPLES",
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
    "poisson",
    "read_azure_trace",
    "resolve_trace",
    "scale_load",
    "trace_help",
    "trace_names",
    "window",
]
