"""Synthetic traces: Poisson, bursty (two-state MMPP) and diurnal arrivals.

Each generator returns a :class:`Trace` like the file readers do, and is deterministic
for its ``seed``: it owns a :class:`random.Random` and touches no global state. The
first request arrives at 0.0 s (the process is observed from an arrival on), and the
others follow the arrival process.

Arrival times and request lengths come from two separate random streams, both derived
from ``seed``. So the same seed gives the same arrival times whatever
:class:`LengthSampler` is used, and two length models can be compared under an
identical arrival pattern.

Prompt and output lengths come from a :class:`LengthSampler`:

- :class:`ResampledLengths` draws whole requests (prompt, output and workload together,
  with replacement) from a real trace, by default the bundled conversation sample, so
  the lengths keep the trace's joint distribution.
- :class:`LognormalLengths` draws prompt and output lengths independently from
  lognormal distributions with the given medians and shape parameters.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from switchyard.contracts.messages import WorkloadType
from switchyard.traces.azure import Trace, TraceRequest, bundled_sample


class Lengths(NamedTuple):
    """The size and class of one synthetic request."""

    prompt_tokens: int
    output_tokens: int
    workload: WorkloadType


class LengthSampler(Protocol):
    """Where a synthetic request's prompt and output lengths come from."""

    @property
    def description(self) -> str:
        """One line for a trace's ``source``: the distribution and where it comes from."""
        ...

    def sample(self, rng: random.Random) -> Lengths:
        """One request's lengths, using only ``rng`` for randomness."""
        ...


@dataclass(frozen=True, slots=True)
class ResampledLengths:
    """Lengths resampled with replacement from the requests of ``trace``.

    A whole request is drawn at a time, so its prompt length, output length and
    workload stay together as they were in the trace.
    """

    trace: Trace

    @property
    def description(self) -> str:
        return f"resampled from {self.trace.name} ({self.trace.source})"

    def sample(self, rng: random.Random) -> Lengths:
        request = rng.choice(self.trace.requests)
        return Lengths(request.prompt_tokens, request.output_tokens, request.workload)


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Independent lognormal prompt and output lengths.

    A length is ``round(median * exp(sigma * Z))`` for a standard normal ``Z``, at
    least 1 token (a request has a prompt and an output) and at most ``max_tokens``
    when one is given (the heavy tail of a lognormal would otherwise produce lengths no
    model accepts).

    Attributes:
        prompt_median_tokens: median prompt length (> 0).
        prompt_sigma: shape of the prompt length distribution, the standard deviation
            of its logarithm (>= 0; 0 makes every prompt the median).
        output_median_tokens: median output length (> 0).
        output_sigma: shape of the output length distribution (>= 0).
        workload: the workload class given to every request.
        max_tokens: upper bound on each length, or None for none.

    Raises:
        ValueError: on construction, naming the parameter that is out of range.
    """

    prompt_median_tokens: float
    prompt_sigma: float
    output_median_tokens: float
    output_sigma: float
    workload: WorkloadType = WorkloadType.OTHER
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _require_positive("prompt_median_tokens", self.prompt_median_tokens)
        _require_non_negative("prompt_sigma", self.prompt_sigma)
        _require_positive("output_median_tokens", self.output_median_tokens)
        _require_non_negative("output_sigma", self.output_sigma)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens!r}")

    @property
    def description(self) -> str:
        cap = "" if self.max_tokens is None else f", at most {self.max_tokens} tokens"
        return (
            f"lognormal: prompt median {self.prompt_median_tokens:g} tokens "
            f"sigma {self.prompt_sigma:g}, output median {self.output_median_tokens:g} "
            f"tokens sigma {self.output_sigma:g}{cap}, workload {self.workload.value}"
        )

    def _draw(self, rng: random.Random, median_tokens: float, sigma: float) -> int:
        tokens = max(1, round(rng.lognormvariate(math.log(median_tokens), sigma)))
        return tokens if self.max_tokens is None else min(tokens, self.max_tokens)

    def sample(self, rng: random.Random) -> Lengths:
        return Lengths(
            self._draw(rng, self.prompt_median_tokens, self.prompt_sigma),
            self._draw(rng, self.output_median_tokens, self.output_sigma),
            self.workload,
        )


@functools.cache
def default_lengths() -> ResampledLengths:
    """Lengths resampled from the bundled conversation sample (read once)."""
    return ResampledLengths(bundled_sample(WorkloadType.CONVERSATION))


def _require_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _require_positive(name: str, value: float) -> None:
    _require_finite(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _require_non_negative(name: str, value: float) -> None:
    _require_finite(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _require_requests(requests: int) -> None:
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests!r}")


def _build(
    name: str,
    process: str,
    arrivals_s: list[float],
    seed: int,
    lengths: LengthSampler | None,
) -> Trace:
    sampler = lengths if lengths is not None else default_lengths()
    # A stream of its own, so that the arrival times do not depend on the sampler.
    rng = random.Random(f"{seed}/lengths")
    requests = []
    for arrival_s in arrivals_s:
        drawn = sampler.sample(rng)
        requests.append(
            TraceRequest(
                arrival_s=arrival_s,
                prompt_tokens=drawn.prompt_tokens,
                output_tokens=drawn.output_tokens,
                workload=drawn.workload,
            )
        )
    return Trace(
        name=name,
        source=f"synthetic: {process}, seed {seed}; lengths {sampler.description}",
        requests=tuple(requests),
    )


def poisson(
    rate_rps: float, requests: int, *, seed: int = 0, lengths: LengthSampler | None = None
) -> Trace:
    """A homogeneous Poisson process: exponential inter-arrival times of mean ``1/rate_rps``.

    Args:
        rate_rps: arrivals per second (> 0).
        requests: how many requests (>= 1).
        seed: seeds both the arrival and the length stream.
        lengths: where lengths come from; by default resampled from the bundled
            conversation sample.

    Raises:
        ValueError: naming the parameter that is out of range.
    """
    _require_positive("rate_rps", rate_rps)
    _require_requests(requests)
    rng = random.Random(seed)
    arrivals_s = [0.0]
    now_s = 0.0
    while len(arrivals_s) < requests:
        now_s += rng.expovariate(rate_rps)
        arrivals_s.append(now_s)
    return _build(
        f"poisson(rate_rps={rate_rps:g}, requests={requests}, seed={seed})",
        f"Poisson arrivals at {rate_rps:g} rps",
        arrivals_s,
        seed,
        lengths,
    )


def bursty_mean_rate_rps(
    base_rate_rps: float, burst_rate_rps: float, mean_base_s: float, mean_burst_s: float
) -> float:
    """The long-run arrival rate of :func:`bursty`: the dwell-weighted mean of both rates."""
    return (base_rate_rps * mean_base_s + burst_rate_rps * mean_burst_s) / (
        mean_base_s + mean_burst_s
    )


def bursty(
    base_rate_rps: float,
    burst_rate_rps: float,
    requests: int,
    *,
    mean_base_s: float = 30.0,
    mean_burst_s: float = 5.0,
    seed: int = 0,
    lengths: LengthSampler | None = None,
) -> Trace:
    """A two-state Markov-modulated Poisson process (MMPP-2): calm spells and bursts.

    The process alternates between a *base* state, where requests arrive as a Poisson
    process of rate ``base_rate_rps``, and a *burst* state of rate ``burst_rate_rps``.
    The time spent in each visit to a state is exponential with mean ``mean_base_s``
    or ``mean_burst_s``. The initial state is drawn from the stationary distribution
    (burst with probability ``mean_burst_s / (mean_base_s + mean_burst_s)``), so the
    long-run rate is :func:`bursty_mean_rate_rps` from the start. Inter-arrival times
    are more variable than a Poisson process of the same mean rate (coefficient of
    variation above 1), which is what stresses queueing and rebalancing.

    Args:
        base_rate_rps: arrival rate in the base state (>= 0; 0 gives on/off traffic).
        burst_rate_rps: arrival rate in the burst state (> ``base_rate_rps``).
        requests: how many requests (>= 1).
        mean_base_s: mean time spent in the base state per visit (> 0).
        mean_burst_s: mean time spent in the burst state per visit (> 0).
        seed: seeds both the arrival and the length stream.
        lengths: where lengths come from; by default resampled from the bundled
            conversation sample.

    Raises:
        ValueError: naming the parameter that is out of range.
    """
    _require_non_negative("base_rate_rps", base_rate_rps)
    _require_positive("burst_rate_rps", burst_rate_rps)
    if burst_rate_rps <= base_rate_rps:
        raise ValueError(
            f"burst_rate_rps must be greater than base_rate_rps ({base_rate_rps:g}), "
            f"got {burst_rate_rps!r}"
        )
    _require_requests(requests)
    _require_positive("mean_base_s", mean_base_s)
    _require_positive("mean_burst_s", mean_burst_s)

    rng = random.Random(seed)
    in_burst = rng.random() < mean_burst_s / (mean_base_s + mean_burst_s)
    state_left_s = rng.expovariate(1.0 / (mean_burst_s if in_burst else mean_base_s))
    arrivals_s = [0.0]
    now_s = 0.0
    while len(arrivals_s) < requests:
        rate_rps = burst_rate_rps if in_burst else base_rate_rps
        gap_s = rng.expovariate(rate_rps) if rate_rps > 0 else math.inf
        if gap_s < state_left_s:
            now_s += gap_s
            state_left_s -= gap_s
            arrivals_s.append(now_s)
        else:
            # The state ends first. Exponential gaps are memoryless, so drawing a fresh
            # gap in the next state is exact, not an approximation.
            now_s += state_left_s
            in_burst = not in_burst
            state_left_s = rng.expovariate(1.0 / (mean_burst_s if in_burst else mean_base_s))
    return _build(
        f"bursty(base_rate_rps={base_rate_rps:g}, burst_rate_rps={burst_rate_rps:g}, "
        f"requests={requests}, mean_base_s={mean_base_s:g}, mean_burst_s={mean_burst_s:g}, "
        f"seed={seed})",
        f"MMPP-2 arrivals, {base_rate_rps:g} rps for ~{mean_base_s:g} s, "
        f"{burst_rate_rps:g} rps bursts for ~{mean_burst_s:g} s",
        arrivals_s,
        seed,
        lengths,
    )


def diurnal(
    mean_rate_rps: float,
    requests: int,
    *,
    amplitude: float = 0.5,
    period_s: float = 3600.0,
    seed: int = 0,
    lengths: LengthSampler | None = None,
) -> Trace:
    """A non-homogeneous Poisson process with a sinusoidal rate, generated by thinning.

    The rate at ``t`` seconds is ``mean_rate_rps * (1 + amplitude * sin(2 pi t /
    period_s))``: it starts at the mean, peaks a quarter period in, and is lowest at
    three quarters. So the first half of every period is the busy half. Candidates
    are drawn at the peak rate and each is kept with probability rate(t) / peak
    (Lewis and Shedler's thinning), which is exact for a bounded rate.

    Args:
        mean_rate_rps: the rate averaged over a period (> 0).
        requests: how many requests (>= 1).
        amplitude: relative swing of the rate, in [0, 1]; 0 is a plain Poisson
            process, 1 lets the rate touch zero at the trough.
        period_s: length of one cycle (> 0); a day is 86400.
        seed: seeds both the arrival and the length stream.
        lengths: where lengths come from; by default resampled from the bundled
            conversation sample.

    Raises:
        ValueError: naming the parameter that is out of range.
    """
    _require_positive("mean_rate_rps", mean_rate_rps)
    _require_requests(requests)
    _require_finite("amplitude", amplitude)
    if not 0.0 <= amplitude <= 1.0:
        raise ValueError(f"amplitude must be in [0, 1], got {amplitude!r}")
    _require_positive("period_s", period_s)

    rng = random.Random(seed)
    peak_rps = mean_rate_rps * (1.0 + amplitude)
    radians_per_s = 2.0 * math.pi / period_s
    arrivals_s = [0.0]
    now_s = 0.0
    while len(arrivals_s) < requests:
        now_s += rng.expovariate(peak_rps)
        rate_rps = mean_rate_rps * (1.0 + amplitude * math.sin(radians_per_s * now_s))
        if rng.random() * peak_rps < rate_rps:
            arrivals_s.append(now_s)
    return _build(
        f"diurnal(mean_rate_rps={mean_rate_rps:g}, requests={requests}, "
        f"amplitude={amplitude:g}, period_s={period_s:g}, seed={seed})",
        f"sinusoidal Poisson arrivals, mean {mean_rate_rps:g} rps, amplitude "
        f"{amplitude:g}, period {period_s:g} s",
        arrivals_s,
        seed,
        lengths,
    )
