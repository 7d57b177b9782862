"""Does the live stack agree with the simulator? One trace slice, one policy, both ways.

The live side is a replay (:func:`loadgen.replay.replay`) of a trace slice against a stack
of emulated LLM workers whose time scale equals the replay's speed-up, so that one wall
second of the replay is ``speedup`` seconds of the trace, for arrivals and for modelled
execution alike. The simulated side is :class:`research.llm.simulator.Simulator` over
the same rows, the same policy and a cluster of the same performance profiles in the same
order. Both sides are then read in *trace seconds*: a live latency is the client's wall
latency times the speed-up.

Only requests that both sides completed are compared (a request the live stack refused
or failed, or one too large for every worker's KV cache, is counted and left out), so
that the two latency distributions cover the same requests.

What the comparison reports besides P50 and P99 says where a gap comes from:

- ``live_overhead_p50_s``: the control plane's share of a live latency (client latency
  minus the worker's execution): Kafka hops, Redis writes, HTTP, the scheduler's wait
  for predictions. The simulator has none; in trace seconds it grows with the speed-up.
- ``live_wait_p50_s`` / ``sim_wait_p50_s``: from arrival at the ingress (live) or the
  trace (simulated) to admission into a batch: scheduling plus queueing.
- ``live_execution_p50_s`` / ``sim_execution_p50_s``: admission to the last token. The
  emulated worker runs the simulator's batching model in real time; where it runs
  slower, its event loop was late (a busy process, sleep resolution) or it grouped
  decode steps (at most :data:`services.worker.backends.emulated_llm.STEP_QUANTUM_WALL_S`
  of wall time, which delays the admission of a new arrival).
- ``paired_gap_p50_s``: the median over requests of live minus simulated latency.

Time to first token (arrival to the first token) and time per output token (first token
to the last, over the tokens after the first: :func:`switchyard.slo.time_per_output_token_s`)
are compared the same way, P50 and P99. The live ones come from the answer's timeline,
the ingress's arrival and the worker's first and last token (one machine, one clock), so
they include the control plane's way to the worker but not the way back.

The live scheduler also differs in what it knows: it sees workers through heartbeats
and its own recent decisions (the simulator sees every change at once), and its
predictions come from the predictor service rather than a predictor trained on the
slice. Those change decisions, not the cost of a decision, so they show up as a gap in
waiting, not in overhead.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.policies.registry import PolicyOptions, make_llm_policy
from switchyard.slo import time_per_output_token_s
from switchyard.stats import quantile

from loadgen.replay_records import OK, RequestRecord
from research.llm.config import SimulationConfig
from research.llm.request import LlmTraceRequest
from research.llm.simulator import Simulator

__all__ = [
    "DEFAULT_TOLERANCE",
    "Agreement",
    "AgreementError",
    "SimulatedLatency",
    "compare",
    "format_table",
    "simulate",
]

DEFAULT_TOLERANCE = 0.15
"""The relative P50 and P99 gap within which live and simulated runs agree."""


class AgreementError(ValueError):
    """A comparison that cannot be made; the message says why."""


@dataclass(frozen=True, slots=True)
class SimulatedLatency:
    """One simulated request, in trace seconds."""

    index: int
    latency_s: float
    wait_s: float
    """Arrival to first admission into a batch."""
    execution_s: float
    """First admission to the last token."""
    worker_id: str
    """The worker it finished on (``w00``, ``w01``, ...: the profiles' order)."""
    ttft_s: float = math.nan
    """Arrival to the first token."""
    tpot_s: float | None = None
    """Time per output token after the first (None for a one-token answer)."""


def simulate(
    rows: Sequence[LlmTraceRequest],
    *,
    policy: str,
    profiles: Sequence[str],
    seed: int = 0,
    options: PolicyOptions | None = None,
    chunked_prefill_tokens: int | None = None,
    prefill_workers: int | None = None,
    decode_at_arrival: bool = False,
    heartbeat_s: float | None = None,
) -> dict[int, SimulatedLatency]:
    """Simulate ``rows`` under ``policy`` on one worker per entry of ``profiles`` (in that
    order, as the live stack's workers are started), with chunked prefill at
    ``chunked_prefill_tokens`` when given, and the first ``prefill_workers`` workers
    prefilling for the others when given (their decode workers chosen on arrival with
    ``decode_at_arrival``, as the live placer does); returns each completed request by its row
    index.

    Raises:
        UnknownPolicyError, SimulationError: a bad policy name, an unknown profile, or
            profiles serving different models.
    """
    if not profiles:
        raise AgreementError("at least one worker profile is needed")
    simulator = Simulator(
        make_llm_policy(policy, options or PolicyOptions()),
        SimulationConfig(
            workers=len(profiles),
            profiles=tuple(profiles),
            seed=seed,
            chunked_prefill_tokens=chunked_prefill_tokens,
            prefill_workers=prefill_workers,
            decode_at_arrival=decode_at_arrival,
            heartbeat_s=heartbeat_s,
        ),
    )
    simulator.run(rows)
    return {
        request.index: SimulatedLatency(
            index=request.index,
            latency_s=request.finished_s - request.arrival_s,
            wait_s=request.started_s - request.arrival_s,
            execution_s=request.finished_s - request.started_s,
            worker_id=request.served_on,
            ttft_s=request.first_token_s - request.arrival_s,
            tpot_s=time_per_output_token_s(
                request.first_token_s, request.finished_s, request.output_tokens
            ),
        )
        for request in simulator.completed
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Agreement:
    """Live against simulated latencies of one trace slice under one policy.

    Every ``_s`` figure is in trace seconds (live wall seconds times ``speedup``); the
    ``_gap`` figures are relative, ``live / simulated - 1``.
    """

    trace: str
    policy: str
    speedup: float
    workers: tuple[str, ...]
    planned: int
    compared: int
    """Requests that both sides completed."""
    live_not_ok: int
    """Planned requests without a 2xx live answer (refused, failed, unanswered)."""
    sim_not_completed: int
    """Planned requests the simulator did not complete (too large for every worker)."""
    sim_p50_s: float
    sim_p99_s: float
    live_p50_s: float
    live_p99_s: float
    p50_gap: float
    p99_gap: float
    paired_gap_p50_s: float
    sim_wait_p50_s: float
    sim_execution_p50_s: float
    live_wait_p50_s: float | None
    live_execution_p50_s: float | None
    live_overhead_p50_s: float | None
    sim_ttft_p50_s: float | None
    sim_ttft_p99_s: float | None
    live_ttft_p50_s: float | None
    live_ttft_p99_s: float | None
    """None when no compared answer carried its first token's time."""
    sim_tpot_p50_s: float | None
    sim_tpot_p99_s: float | None
    live_tpot_p50_s: float | None
    live_tpot_p99_s: float | None
    """None when no compared answer had two tokens or more (and its times)."""
    paired_ttft_gap_p50_s: float | None = None
    """Median over requests of live TTFT less simulated TTFT."""
    sim_prefill_p50_s: float | None = None
    """Median of start to first token in the simulation (the prefill and the wait for
    the iteration it joins)."""
    live_legs_p50_s: tuple[float, float, float] | None = None
    """Medians of a live first token's three legs: arrival to assignment (the ingress's
    decision), assignment to start (the way to the worker and the wait in its queue),
    start to first token (as ``sim_prefill_p50_s``); None when no answer had all four
    times."""
    sim_by_worker: dict[str, int]
    """Compared requests per worker in the simulation; a different spread from
    ``live_by_worker`` means the policy decided differently, not that it ran slower."""
    live_by_worker: dict[str, int]

    def within(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        """Whether P50 and P99 both agree within ``tolerance`` (relative)."""
        return abs(self.p50_gap) <= tolerance and abs(self.p99_gap) <= tolerance

    def token_gaps(self) -> dict[str, float | None]:
        """``live / simulated - 1`` of TTFT and TPOT at P50 and P99 (None where either
        side has no figure)."""
        return {
            "ttft_p50": _relative(self.live_ttft_p50_s, self.sim_ttft_p50_s),
            "ttft_p99": _relative(self.live_ttft_p99_s, self.sim_ttft_p99_s),
            "tpot_p50": _relative(self.live_tpot_p50_s, self.sim_tpot_p50_s),
            "tpot_p99": _relative(self.live_tpot_p99_s, self.sim_tpot_p99_s),
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["workers"] = list(self.workers)
        data["token_gaps"] = self.token_gaps()
        return data


def _relative(live: float | None, simulated: float | None) -> float | None:
    if live is None or simulated is None:
        return None
    return live / simulated - 1 if simulated > 0 else math.inf


def _p(values: Sequence[float], q: float) -> float:
    return quantile(values, q)


def _p_or_none(values: Sequence[float], q: float) -> float | None:
    return _p(values, q) if values else None


def compare(
    records: Sequence[RequestRecord],
    simulated: dict[int, SimulatedLatency],
    *,
    speedup: float,
    trace: str,
    policy: str,
    workers: Sequence[str],
) -> Agreement:
    """Compare a replay's ``records`` with the simulation of the same plan.

    Raises:
        AgreementError: ``speedup`` is not a positive number, or no request was
            completed by both sides.
    """
    if not (math.isfinite(speedup) and speedup > 0):
        raise AgreementError(f"speedup must be a finite number > 0, got {speedup!r}")
    live: dict[int, RequestRecord] = {
        r.index: r for r in records if r.outcome == OK and r.latency_s is not None
    }
    both = sorted(set(live) & set(simulated))
    if not both:
        raise AgreementError(
            f"no request was completed by both the live stack ({len(live)} answered) and "
            f"the simulator ({len(simulated)} completed)"
        )
    live_latency: list[float] = []
    sim_latency: list[float] = []
    paired: list[float] = []
    live_wait: list[float] = []
    live_execution: list[float] = []
    live_overhead: list[float] = []
    live_ttft: list[float] = []
    live_tpot: list[float] = []
    paired_ttft: list[float] = []
    legs: list[tuple[float, float, float]] = []
    for index in both:
        record = live[index]
        assert record.latency_s is not None
        latency_s = record.latency_s * speedup
        live_latency.append(latency_s)
        sim_latency.append(simulated[index].latency_s)
        paired.append(latency_s - simulated[index].latency_s)
        timeline = record.timeline or {}
        started = timeline.get("started_s")
        finished = timeline.get("finished_s")
        arrived = timeline.get("arrival_s")
        if started is not None and arrived is not None:
            live_wait.append((started - arrived) * speedup)
        if started is not None and finished is not None:
            execution_s = (finished - started) * speedup
            live_execution.append(execution_s)
            live_overhead.append(latency_s - execution_s)
        first = timeline.get("first_token_s")
        if first is not None and arrived is not None:
            live_ttft.append((first - arrived) * speedup)
            if math.isfinite(simulated[index].ttft_s):
                paired_ttft.append((first - arrived) * speedup - simulated[index].ttft_s)
            assigned = timeline.get("assigned_s")
            if assigned is not None and started is not None:
                legs.append(
                    (
                        (assigned - arrived) * speedup,
                        (started - assigned) * speedup,
                        (first - started) * speedup,
                    )
                )
        if first is not None and finished is not None and record.completion_tokens:
            tpot = time_per_output_token_s(first, finished, record.completion_tokens)
            if tpot is not None:
                live_tpot.append(tpot * speedup)
    sim_ttft = [simulated[i].ttft_s for i in both if math.isfinite(simulated[i].ttft_s)]
    sim_tpot = [t for i in both if (t := simulated[i].tpot_s) is not None]
    sim_p50, sim_p99 = _p(sim_latency, 0.5), _p(sim_latency, 0.99)
    live_p50, live_p99 = _p(live_latency, 0.5), _p(live_latency, 0.99)
    return Agreement(
        trace=trace,
        policy=policy,
        speedup=speedup,
        workers=tuple(workers),
        planned=len(records),
        compared=len(both),
        live_not_ok=len(records) - len(live),
        sim_not_completed=len(records) - len(set(simulated) & {r.index for r in records}),
        sim_p50_s=sim_p50,
        sim_p99_s=sim_p99,
        live_p50_s=live_p50,
        live_p99_s=live_p99,
        p50_gap=live_p50 / sim_p50 - 1 if sim_p50 > 0 else math.inf,
        p99_gap=live_p99 / sim_p99 - 1 if sim_p99 > 0 else math.inf,
        paired_gap_p50_s=_p(paired, 0.5),
        sim_wait_p50_s=_p([simulated[i].wait_s for i in both], 0.5),
        sim_execution_p50_s=_p([simulated[i].execution_s for i in both], 0.5),
        live_wait_p50_s=_p_or_none(live_wait, 0.5),
        live_execution_p50_s=_p_or_none(live_execution, 0.5),
        live_overhead_p50_s=_p_or_none(live_overhead, 0.5),
        sim_ttft_p50_s=_p_or_none(sim_ttft, 0.5),
        sim_ttft_p99_s=_p_or_none(sim_ttft, 0.99),
        live_ttft_p50_s=_p_or_none(live_ttft, 0.5),
        live_ttft_p99_s=_p_or_none(live_ttft, 0.99),
        sim_tpot_p50_s=_p_or_none(sim_tpot, 0.5),
        sim_tpot_p99_s=_p_or_none(sim_tpot, 0.99),
        live_tpot_p50_s=_p_or_none(live_tpot, 0.5),
        live_tpot_p99_s=_p_or_none(live_tpot, 0.99),
        paired_ttft_gap_p50_s=_p_or_none(paired_ttft, 0.5),
        sim_prefill_p50_s=_p_or_none(
            [
                simulated[i].ttft_s - simulated[i].wait_s
                for i in both
                if math.isfinite(simulated[i].ttft_s)
            ],
            0.5,
        ),
        live_legs_p50_s=None
        if not legs
        else (
            _p([leg[0] for leg in legs], 0.5),
            _p([leg[1] for leg in legs], 0.5),
            _p([leg[2] for leg in legs], 0.5),
        ),
        sim_by_worker=dict(sorted(Counter(simulated[i].worker_id for i in both).items())),
        live_by_worker=dict(sorted(Counter(live[i].worker_id or "?" for i in both).items())),
    )


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _gap(value: float) -> str:
    return f"{value:+.1%}"


def _spread(by_worker: dict[str, int]) -> str:
    return "-".join(str(count) for count in by_worker.values())


def format_table(rows: Sequence[Agreement]) -> str:
    """The agreement table (markdown), one line per trace and policy, then the
    decomposition of each gap."""
    lines = [
        "| trace | policy | requests | sim P50 | live P50 | gap | sim P99 | live P99 | gap |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in rows:
        lines.append(
            f"| {a.trace} | {a.policy} | {a.compared}/{a.planned} | {_s(a.sim_p50_s)} s "
            f"| {_s(a.live_p50_s)} s | {_gap(a.p50_gap)} | {_s(a.sim_p99_s)} s "
            f"| {_s(a.live_p99_s)} s | {_gap(a.p99_gap)} |"
        )
    lines += [
        "",
        "| trace | policy | paired gap P50 | wait P50 sim / live | execution P50 sim / live "
        "| live overhead P50 | requests per worker sim / live |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for a in rows:
        lines.append(
            f"| {a.trace} | {a.policy} | {a.paired_gap_p50_s:+.2f} s "
            f"| {_s(a.sim_wait_p50_s)} / {_s(a.live_wait_p50_s)} s "
            f"| {_s(a.sim_execution_p50_s)} / {_s(a.live_execution_p50_s)} s "
            f"| {_s(a.live_overhead_p50_s)} s "
            f"| {_spread(a.sim_by_worker)} / {_spread(a.live_by_worker)} |"
        )
    lines += [
        "",
        "| trace | policy | TTFT P50 sim / live | gap | TTFT P99 sim / live | gap "
        "| TPOT P50 sim / live | gap | TPOT P99 sim / live | gap |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in rows:
        gaps = a.token_gaps()
        lines.append(
            f"| {a.trace} | {a.policy} "
            f"| {_ms(a.sim_ttft_p50_s)} / {_ms(a.live_ttft_p50_s)} | {_opt_gap(gaps['ttft_p50'])} "
            f"| {_ms(a.sim_ttft_p99_s)} / {_ms(a.live_ttft_p99_s)} | {_opt_gap(gaps['ttft_p99'])} "
            f"| {_ms(a.sim_tpot_p50_s)} / {_ms(a.live_tpot_p50_s)} | {_opt_gap(gaps['tpot_p50'])} "
            f"| {_ms(a.sim_tpot_p99_s)} / {_ms(a.live_tpot_p99_s)} | {_opt_gap(gaps['tpot_p99'])} |"
        )
    lines += [
        "",
        "| trace | policy | TTFT paired gap P50 | sim: wait, start to first token (P50) "
        "| live: decision, to the worker and queued, start to first token (P50) |",
        "|---|---|---:|---:|---:|",
    ]
    for a in rows:
        paired = (
            "-" if a.paired_ttft_gap_p50_s is None else f"{a.paired_ttft_gap_p50_s * 1000:+.0f} ms"
        )
        live_legs = (
            "-" if a.live_legs_p50_s is None else ", ".join(_ms(v) for v in a.live_legs_p50_s)
        )
        lines.append(
            f"| {a.trace} | {a.policy} | {paired} "
            f"| {_ms(a.sim_wait_p50_s)}, {_ms(a.sim_prefill_p50_s)} | {live_legs} |"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _opt_gap(value: float | None) -> str:
    return "-" if value is None else _gap(value)
