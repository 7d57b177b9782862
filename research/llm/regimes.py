"""Named simulation regimes: which cluster, engine, traces and load a result comes from.

A regime is frozen data plus pure functions that build the simulation's config objects
from it, so that a figure can say where it comes from in one word:

- ``continuous-batching``: what ``bench/gaps_eval.py`` runs. A vLLM-like engine with
  256 batch slots, 8 A100/Llama-2-7B workers, the Azure conversation trace sped up x4.5
  and the code trace x2 (a third of the KV cache and slots in use on conversation). A
  new request hardly waits: its latency is its own decode, shared with the batch.
- ``paper``: the GAPS paper's regime, where queueing dominates. The same workers, the
  same traces, but one request at a time per worker (``max_batch_slots`` 1) and an
  offered load of 85 % of the cluster's capacity. A request's latency is its wait
  behind the work queued ahead of it plus its own service time, which is the model
  GAPS's rules are written for (see :data:`PAPER`).
- ``paper-poisson``: the same, with the same requests at Poisson arrival times (see
  :data:`PAPER_POISSON`).

Everything here (:func:`simulation_config`, :func:`make_simulator`,
:func:`performance_models`, :func:`load_scale`) is a pure function of the regime and the
trace rows.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from switchyard.perf import PerformanceModel, performance_model
from switchyard.policies.registry import LlmPolicy
from switchyard.traces import Trace, TraceRequest, head, resolve_trace, scale_load

from research.llm.config import SimulationConfig, SimulationError
from research.llm.request import LlmTraceRequest, SimRequest
from research.llm.simulator import Simulator

__all__ = [
    "CONTINUOUS_BATCHING",
    "PAPER",
    "PAPER_POISSON",
    "Arrivals",
    "LoadPer8Workers",
    "OfferedUtilisation",
    "Regime",
    "UnknownRegimeError",
    "load_scale",
    "make_simulator",
    "mean_queueing_share",
    "offered_utilisation",
    "performance_models",
    "regime",
    "regime_names",
    "regime_trace",
    "simulation_config",
    "with_poisson_arrivals",
]

A100_LLAMA_7B = "a100-80gb/llama-2-7b"


class UnknownRegimeError(SimulationError):
    """A regime name that is not one of :func:`regime_names`."""


@dataclass(frozen=True, slots=True)
class LoadPer8Workers:
    """Arrivals sped up by ``factor * workers / 8``: the same load per worker at any size."""

    factor: float


@dataclass(frozen=True, slots=True)
class OfferedUtilisation:
    """Arrivals sped up until the offered work is ``share`` of the cluster's capacity.

    Offered work is the arrival rate times the mean service time alone on an idle worker;
    capacity is ``workers * slots`` such services at once, ``slots`` being ``at_slots``
    or else the regime's batch slots. With one slot a worker this is the utilisation of
    a queue (rho); with more it is nominal (a batch of ``b`` takes longer than one
    request, far longer for prefill-bound code requests), so ``at_slots=1`` keeps the
    arrival rate of the one-slot regime while the engine batches.
    """

    share: float
    at_slots: int | None = None


Load = LoadPer8Workers | OfferedUtilisation


class Arrivals(StrEnum):
    """When a regime's requests arrive."""

    TRACE = "trace"
    """At the trace's own times (sped up): the Azure code trace comes in bursts of up to
    67 requests in one second, with silent minutes between."""
    POISSON = "poisson"
    """The same requests in the same order at Poisson times of the same mean rate, drawn
    per seed: the trace's lengths without its burstiness."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Regime:
    """One named simulation setting; :func:`simulation_config` and
    :func:`make_simulator` turn it into a run."""

    name: str
    summary: str
    workers: int
    profile: str = A100_LLAMA_7B
    max_batch_slots: int | None = None
    """Requests one worker runs at once; None: the profile's own (continuous batching)."""
    loads: Mapping[str, Load]
    """Per trace name (``resolve_trace`` spec): how its arrivals are sped up."""
    requests: int
    """Requests from the start of each trace."""
    arrivals: Arrivals = Arrivals.TRACE
    slo_scale: float = 5.0
    """End-to-end objective: latency at most this times the idle service time."""
    predictor_error: float = 0.0
    seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self) -> None:
        if self.max_batch_slots is not None and self.max_batch_slots < 1:
            raise SimulationError(f"max_batch_slots must be at least 1, got {self.max_batch_slots}")
        if self.requests < 1:
            raise SimulationError(f"requests must be at least 1, got {self.requests}")
        if not self.loads:
            raise SimulationError(f"regime {self.name!r} names no trace")
        for trace, load in self.loads.items():
            value = load.factor if isinstance(load, LoadPer8Workers) else load.share
            if not value > 0:
                raise SimulationError(f"regime {self.name!r}: load of {trace} must be > 0")
            if isinstance(load, OfferedUtilisation) and (load.at_slots or 1) < 1:
                raise SimulationError(f"regime {self.name!r}: at_slots of {trace} must be >= 1")

    @property
    def traces(self) -> tuple[str, ...]:
        return tuple(self.loads)


CONTINUOUS_BATCHING = Regime(
    name="continuous-batching",
    summary="vLLM-like continuous batching (256 slots), busy short of the knee: "
    "what bench/gaps_eval.py runs",
    workers=8,
    loads=MappingProxyType(
        {"azure-code": LoadPer8Workers(2.0), "azure-conv": LoadPer8Workers(4.5)}
    ),
    requests=6000,
)
"""``bench/gaps_eval.py``'s grid at 8 workers: conversation x4.5, code x2 (its
``LOAD_PER_8``), the profile's 256 slots, 6,000 requests of each trace."""

PAPER = Regime(
    name="paper",
    summary="queueing-dominated: one request at a time per worker, 85 % offered load",
    workers=8,
    max_batch_slots=1,
    loads=MappingProxyType(
        {"azure-code": OfferedUtilisation(0.85), "azure-conv": OfferedUtilisation(0.85)}
    ),
    requests=4000,
)
"""The GAPS paper's regime, as far as DESIGN.md describes it.

- Traces: the Azure code and conversation traces, as the paper used (their first 4,000
  requests: at 85 % load about 5 simulated minutes of code and 30 of conversation).
- Cluster: 8 workers, within the paper's 4 to 32 and the size the project's grid
  centres on; A100/Llama-2-7B, the project's reference profile (DESIGN.md names no GPU).
- Engine: ``max_batch_slots`` 1. GAPS measures a queue "in seconds of predicted work,
  not a count" and picks the worker minimising queued work plus ``s~``: that is a
  request's completion time only when a worker serves its queue one request after
  another, as in the paper's queueing model. With 256 slots the same sum is off by the
  batch size (docs/benchmarks.md, "GAPS evaluation").
- Load: 85 % of capacity on both traces. High enough that queues form (an M/G/1 queue
  at 85 % waits about 5.7 times the mean residual service), low enough that a balanced
  cluster is stable; the same share on both traces, so neither is favoured.
- Objective, predictor and seeds as the project's grid: latency at most 5 times the
  idle service time (the paper's end-to-end objective), the linear predictor, error 0
  (the paper sweeps 0 to 40 %), three seeds.
"""

PAPER_POISSON = replace(
    PAPER,
    name="paper-poisson",
    summary="the paper regime with Poisson arrivals: the traces' requests without their bursts",
    arrivals=Arrivals.POISSON,
)
""":data:`PAPER` with the same requests at Poisson arrival times. The code trace's own
arrivals come in bursts: weighed by the requests they hold, its 10-second windows hold
3.9 times its mean rate and its one-minute windows 2.2 times, so at 85 % of the mean
rate a typical request arrives while about two to three times the cluster's capacity
is offered, and every policy misses most objectives (the conversation trace is steady:
1.0 times). Whether the paper replayed the timestamps is not known, so both are named."""

_REGIMES: Mapping[str, Regime] = MappingProxyType(
    {r.name: r for r in (PAPER, PAPER_POISSON, CONTINUOUS_BATCHING)}
)


def regime_names() -> tuple[str, ...]:
    """Every named regime."""
    return tuple(_REGIMES)


def regime(name: str) -> Regime:
    """The regime called ``name``.

    Raises:
        UnknownRegimeError: not a known name; the message lists them.
    """
    try:
        return _REGIMES[name]
    except KeyError:
        known = ", ".join(_REGIMES)
        raise UnknownRegimeError(f"unknown regime {name!r}; known: {known}") from None


def performance_models(r: Regime) -> tuple[PerformanceModel, ...]:
    """The regime's workers' performance models: the profile with its batch slots
    replaced when the regime sets them.

    Example: ``performance_models(PAPER)[0].max_batch_slots == 1``.
    """
    model = performance_model(r.profile)
    if r.max_batch_slots is not None:
        model = replace(model, max_batch_slots=r.max_batch_slots)
    return (model,)


def simulation_config(
    r: Regime, *, seed: int = 0, predictor_error: float | None = None
) -> SimulationConfig:
    """The :class:`SimulationConfig` of one run of ``r``."""
    return SimulationConfig(
        workers=r.workers,
        profiles=(r.profile,),
        slo_scale=r.slo_scale,
        predictor_error=r.predictor_error if predictor_error is None else predictor_error,
        seed=seed,
        max_batch_slots=r.max_batch_slots,
    )


def offered_utilisation(
    rows: Sequence[LlmTraceRequest],
    model: PerformanceModel,
    workers: int,
    slots: int | None = None,
) -> float:
    """Offered work over capacity (see :class:`OfferedUtilisation`) of ``rows`` as they
    are, counting ``slots`` (default the model's batch slots) services per worker.

    Worked number: 4,000 conversation requests over 815 s (4.9 a second) with a mean idle
    service of 3.13 s offer 15.4 services at once; 8 workers of one slot: 1.92.
    """
    if len(rows) < 2:
        raise SimulationError("offered load needs at least two arrivals")
    span_s = rows[-1].arrival_s - rows[0].arrival_s
    if span_s <= 0:
        raise SimulationError("offered load needs arrivals spread over time")
    rate_rps = (len(rows) - 1) / span_s
    mean_service_s = statistics.fmean(
        model.idle_service_s(row.prompt_tokens, row.output_tokens) for row in rows
    )
    return rate_rps * mean_service_s / (workers * (slots or model.max_batch_slots))


def load_scale(r: Regime, trace: str, rows: Sequence[LlmTraceRequest]) -> float:
    """The factor the arrivals of ``rows`` (the head of ``trace``, at its own rate) are
    sped up by in ``r``.

    Raises:
        UnknownRegimeError: ``trace`` is not one of the regime's.
    """
    load = r.loads.get(trace)
    if load is None:
        raise UnknownRegimeError(f"regime {r.name!r} has no trace {trace!r}; it has {r.traces}")
    if isinstance(load, LoadPer8Workers):
        return load.factor * r.workers / 8
    (model,) = performance_models(r)
    return load.share / offered_utilisation(rows, model, r.workers, load.at_slots)


def with_poisson_arrivals(trace: Trace, seed: int) -> Trace:
    """``trace``'s requests, in order, at Poisson times of the same mean rate."""
    rows = trace.requests
    if len(rows) < 2:
        return trace
    rate_rps = (len(rows) - 1) / max(rows[-1].arrival_s - rows[0].arrival_s, 1e-9)
    rng = random.Random(seed)
    now_s = 0.0
    requests: list[TraceRequest] = []
    for row in rows:
        requests.append(replace(row, arrival_s=now_s))
        now_s += rng.expovariate(rate_rps)
    return Trace(
        name=f"{trace.name}~poisson({seed})",
        source=f"{trace.source}, Poisson arrivals (seed {seed})",
        requests=tuple(requests),
    )


def regime_trace(r: Regime, trace: str, *, seed: int = 0) -> tuple[TraceRequest, ...]:
    """The rows a run of ``r`` replays for ``trace``: its head, at Poisson times drawn
    from ``seed`` when the regime says so, sped up by :func:`load_scale` (reads the
    trace file)."""
    rows = head(resolve_trace(trace), r.requests)
    if r.arrivals is Arrivals.POISSON:
        rows = with_poisson_arrivals(rows, seed)
    return scale_load(rows, load_scale(r, trace, rows.requests)).requests


def make_simulator(
    r: Regime, policy: LlmPolicy, *, seed: int = 0, predictor_error: float | None = None
) -> Simulator:
    """A simulator of one run of ``policy`` in ``r``."""
    return Simulator(policy, simulation_config(r, seed=seed, predictor_error=predictor_error))


def mean_queueing_share(completed: Sequence[SimRequest]) -> float:
    """Mean wait before a request's first iteration over its mean latency: near 0 when
    requests start at once (continuous batching below the knee), near 1 when latency
    is mostly waiting.

    Worked number: waits of 3 s and 1 s, latencies of 5 s and 3 s: 2 / 4 = 0.5.
    """
    if not completed:
        raise SimulationError("no completed request to measure")
    wait_s = statistics.fmean(r.started_s - r.arrival_s for r in completed)
    latency_s = statistics.fmean(r.finished_s - r.arrival_s for r in completed)
    return wait_s / latency_s
