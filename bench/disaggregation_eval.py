"""Prefill/decode disaggregation as a cluster option: capacity and token latencies.

For ``switchyard`` and ``jsq`` (and ``splitwise``, the stage-aware baseline, for
reference) on the first 4,000 requests of the Azure conversation and code traces and of
the Mooncake trace, 16 A100/llama-2-7b workers, with disaggregation off and with 4, 6
and 8 of the 16 workers prefilling and the rest decoding
(:mod:`research.llm.disaggregation`; ``splitwise`` always splits: "off" is its own
split, a quarter of the workers):

1. capacity: the highest offered rate at which 90 % of the requests meet every
   objective (:func:`bench.capacity_eval._run`, the search and objectives of ``make
   bench-capacity``: 5 s TTFT on Mooncake), with TTFT and TPOT P99 at that load;
2. TTFT and TPOT at fixed offered rates: each trace at the capacity ``jsq`` and
   ``switchyard`` have without disaggregation, every setting at the same rate;
3. what the KV-cache transfer alone costs: its time per request on the profile's
   interconnect, and the share of requests whose transfer, spread over their output
   tokens after the first, already exceeds the TPOT objective.

One process, one seed a run. ``python -m bench.disaggregation_eval [--json OUT]
[--requests N]``; Markdown tables go to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from switchyard.perf import performance_model
from switchyard.slo import token_slos
from switchyard.stats import quantile
from switchyard.traces import head, resolve_trace, scale_load

from bench.capacity_eval import A100, TTFT_OBJECTIVE_S, Search, _run
from research.llm.capacity_run import capacity_cell, held_rps
from research.llm.experiment import ExperimentConfig, TraceForScale, run_experiment
from research.llm.request import LlmTraceRequest

TRACES = ("azure-conv", "azure-code", "mooncake")
POLICIES = ("switchyard", "jsq", "splitwise")
SETTINGS: tuple[int | None, ...] = (None, 4, 6, 8)
"""Workers of the 16 that only prefill (None: off)."""
WORKERS = 16


def _label(policy: str, setting: int | None) -> str:
    if setting is not None:
        return f"{setting} P + {WORKERS - setting} D"
    return "off (own 4 P + 12 D)" if policy == "splitwise" else "off"


def _timed_search(search: Search) -> dict[str, Any]:
    started = time.perf_counter()
    result = _run(search)
    return {**result, "search_wall_s": time.perf_counter() - started}


def capacity(requests: int) -> list[dict[str, Any]]:
    """One capacity search per trace, policy and setting (:func:`bench.capacity_eval._run`)."""
    return [
        _timed_search(Search(trace, WORKERS, policy, (A100,), requests, prefill_workers=split))
        for trace, policy, split in itertools.product(TRACES, POLICIES, SETTINGS)
    ]


def _off_capacity(found: Sequence[dict[str, Any]], trace: str, policy: str) -> float:
    (result,) = (
        r
        for r in found
        if r["trace"].startswith(trace) and r["policy"] == policy and r["prefill_workers"] is None
    )
    return held_rps(result, 0)


def _always(rows: Sequence[LlmTraceRequest]) -> TraceForScale:
    """The trace rows whatever the scale asked (they are already at the one wanted)."""
    return lambda _scale: rows


def fixed_load(requests: int, found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    runs = []
    for trace_name in TRACES:
        trace = head(resolve_trace(trace_name), requests)
        at_rate: dict[float, list[str]] = {}
        for name in ("jsq", "switchyard"):
            at_rate.setdefault(_off_capacity(found, trace_name, name), []).append(name)
        base = ExperimentConfig(
            trace=trace.name,
            policies=POLICIES,
            workers=(WORKERS,),
            profiles=(A100,),
            token_slos=token_slos(ttft_s=TTFT_OBJECTIVE_S.get(trace_name)),
        )
        for rate, names in at_rate.items():
            scale = rate / trace.mean_rate_rps
            rows = scale_load(trace, scale).requests
            at = " and ".join(f"{name}'s" for name in names) + " capacity, off"
            batch = [
                {**run, "prefill_workers": setting, "offered_rps": rate, "at": at}
                for setting in SETTINGS
                for run in run_experiment(
                    replace(base, load_scales=(scale,), prefill_workers=setting),
                    _always(rows),
                )
            ]
            batch.sort(key=lambda r: POLICIES.index(r["policy"]))  # stable: settings in order
            runs += batch
    return runs


def kv_transfers(requests: int) -> list[dict[str, Any]]:
    """What moving each request's KV cache (prompt plus the first token) costs on the
    profile's interconnect, per trace: the time the hand-off adds to a request, and the
    share of requests it alone makes miss the TPOT objective (it delays the second
    token, and TPOT spreads it over the output tokens after the first)."""
    perf = performance_model(A100)
    out = []
    for trace_name in TRACES:
        rows = head(resolve_trace(trace_name), requests).requests
        slos = token_slos(ttft_s=TTFT_OBJECTIVE_S.get(trace_name))
        times = [perf.kv_transfer_s(r.prompt_tokens + 1) for r in rows]
        late = sum(
            1
            for r, transfer_s in zip(rows, times, strict=True)
            if r.output_tokens > 1 and transfer_s / (r.output_tokens - 1) > slos[r.workload].tpot_s
        )
        times.sort()
        out.append(
            {
                "trace": trace_name,
                "mean_ms": statistics.fmean(times) * 1000,
                "p99_ms": quantile(times, 0.99) * 1000,
                "tpot_missed_by_transfer": late / len(rows),
            }
        )
    return out


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _held(result: dict[str, Any], key: str, scale: float, digits: int) -> str:
    held = result["targets"][0]["held"]
    return "-" if held is None else f"{held[key] * scale:.{digits}f}"


def markdown(document: dict[str, Any]) -> str:
    """The tables of a run's ``document`` (what ``--json`` writes)."""
    found = document["capacity"]
    out = [
        "Capacity (req/s at 90 % SLO attainment), 16 A100 workers (P: prefill-only, "
        "D: decode-only):",
        "",
        _row(
            "trace", "policy", "pools", "req/s at 90 %", "vs off", "TTFT P99 s there",
            "TPOT P99 ms there", "most goodput, req/s", "search wall s",
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in found:
        off = _off_capacity(found, r["trace"].split("[")[0], r["policy"])
        out.append(
            _row(
                r["trace"], r["policy"], _label(r["policy"], r["prefill_workers"]),
                capacity_cell(r["targets"][0]),
                f"{held_rps(r, 0) / off:.2f}" if off > 0 else "-",
                _held(r, "ttft_p99_s", 1, 2), _held(r, "tpot_p99_s", 1000, 0),
                f"{r['max_goodput']['goodput_rps']:.3g}", f"{r['search_wall_s']:.1f}",
            )
        )  # fmt: skip
    out += [
        "",
        "At fixed offered rates (every setting at the same rate):",
        "",
        _row(
            "trace", "offered req/s", "policy", "pools", "TTFT P50 s", "TTFT P99 s",
            "TPOT P50 ms", "TPOT P99 ms", "P99 s", "TTFT met %", "TPOT met %", "all met %",
            "refused %", "simulated req/s",
        ),
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in document["fixed_load"]:
        out.append(
            _row(
                r["trace"], f"{r['offered_rps']:.3g} ({r['at']})", r["policy"],
                _label(r["policy"], r["prefill_workers"]),
                *(f"{r[key]:.2f}" for key in ("ttft_p50_s", "ttft_p99_s")),
                *(f"{r[key] * 1000:.1f}" for key in ("tpot_p50_s", "tpot_p99_s")),
                f"{r['p99_s']:.2f}",
                *(
                    f"{r[key] * 100:.1f}"
                    for key in ("ttft_attainment", "tpot_attainment", "slo_attainment")
                ),
                f"{r['refused'] / r['requests'] * 100:.1f}", f"{r['simulated_rps']:,.0f}",
            )
        )  # fmt: skip
    out += ["", "KV-cache transfer per request (prompt + first token, A100 profile):", ""]
    out += [
        f"- {t['trace']}: mean {t['mean_ms']:.1f} ms, P99 {t['p99_ms']:.1f} ms; "
        f"{t['tpot_missed_by_transfer'] * 100:.1f} % of the requests miss TPOT from it alone"
        for t in document["kv_transfer"]
    ]
    return "\n".join(out) + "\n"


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.disaggregation_eval",
        description="Capacity and token latencies with prefill/decode disaggregation.",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--requests", type=int, default=4000, help="first N of each trace")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    started = time.perf_counter()
    found = capacity(args.requests)
    document: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"CPython {platform.python_version()}",
        "requests": args.requests,
        "workers": WORKERS,
        "ttft_objective_s": TTFT_OBJECTIVE_S,
        "capacity": found,
        "fixed_load": fixed_load(args.requests, found),
        "kv_transfer": kv_transfers(args.requests),
    }
    document["wall_s"] = time.perf_counter() - started
    print(markdown(document))
    print(f"total wall time {document['wall_s']:.0f} s on {document['machine']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
