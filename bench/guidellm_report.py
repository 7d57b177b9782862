"""The guidellm benchmark's figures: guidellm's report and per-request results, loadgen's
records and the stack's records of guidellm's requests, read as samples; each client's row
(quantiles and rates), the Markdown table, the medians over the runs and the JSON document.

Quantiles are numpy's (linear interpolation), except in the row of guidellm's own report
(nearest rank, its ITL weighted by tokens); throughput is answered requests (and output
tokens) per second from the first request sent to the last answer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.guidellm_setup import GUIDELLM_VERSION, BenchError

METRICS = ("ttft", "itl", "latency")


@dataclasses.dataclass
class Sample:
    """One request as a client (or the stack) saw it; seconds, None when not known."""

    ok: bool
    ttft_s: float | None = None
    itl_s: float | None = None
    latency_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    start_s: float | None = None
    end_s: float | None = None
    send_lag_s: float | None = None
    request_id: str | None = None


@dataclasses.dataclass
class ClientRun:
    """What one client run gave: its samples, its CPU and the stack's over the run."""

    name: str
    samples: list[Sample]
    wall_s: float
    client_cpu_s: float
    stack_cpu_s: float | None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _ms_to_s(value: Any) -> float | None:
    number = _number(value)
    return None if number is None else number / 1000.0


# -- what the clients and the stack recorded ---------------------------------------------------


def read_guidellm(output: Path) -> tuple[list[Sample], dict[str, Any]]:
    """guidellm's JSON output (one benchmark): its requests as samples (successful,
    errored and incomplete) and notes (errors, its own report, its scheduler's counts)."""
    document = json.loads(output.read_text())
    benchmarks = document.get("benchmarks") or []
    if len(benchmarks) != 1:
        raise BenchError(f"guidellm wrote {len(benchmarks)} benchmarks, expected 1 ({output})")
    requests = benchmarks[0]["requests"]
    state = benchmarks[0].get("scheduler_state") or {}
    samples: list[Sample] = []
    errors: list[str] = []
    for status in ("successful", "errored", "incomplete"):
        for entry in requests.get(status) or []:
            info = entry.get("info") or {}
            timings = info.get("timings") or {}
            start = _number(timings.get("request_start"))
            target = _number(timings.get("targeted_start"))
            samples.append(
                Sample(
                    ok=status == "successful",
                    ttft_s=_ms_to_s(entry.get("time_to_first_token_ms")),
                    itl_s=_ms_to_s(entry.get("inter_token_latency_ms")),
                    latency_s=_number(entry.get("request_latency")),
                    output_tokens=entry.get("output_tokens"),
                    prompt_tokens=entry.get("prompt_tokens"),
                    start_s=start,
                    end_s=_number(entry.get("request_end_time")),
                    send_lag_s=start - target if start is not None and target is not None else None,
                    request_id=entry.get("response_id"),
                )
            )
            if status != "successful" and info.get("error"):
                errors.append(str(info["error"])[:200])
    notes = {
        "errors": sorted(set(errors))[:5],
        "own_report": _guidellm_report(benchmarks[0].get("metrics") or {}),
        "scheduler_state": {
            key: state.get(key)
            for key in ("created_requests", "processing_requests", "processed_requests")
        },
    }
    return samples, notes


def _guidellm_report(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """guidellm's own summary of the successful requests: its P50 and P99 (nearest rank;
    its ITL weighted by tokens), its mean request and output-token rates."""

    def part(key: str) -> Mapping[str, Any]:
        summary: Mapping[str, Any] = (metrics.get(key) or {}).get("successful") or {}
        return summary

    def quantiles(key: str, scale: float) -> dict[str, float | None]:
        percentiles = part(key).get("percentiles") or {}
        found = {q: _number(percentiles.get(q)) for q in ("p50", "p99")}
        return {q: None if v is None else v * scale for q, v in found.items()}

    return {
        "ttft": quantiles("time_to_first_token_ms", 0.001),
        "itl": quantiles("inter_token_latency_ms", 0.001),
        "latency": quantiles("request_latency", 1.0),
        "requests": _number(part("request_latency").get("count")),
        "throughput_rps": _number(part("requests_per_second").get("mean")),
        "output_tokens_per_s": _number(part("output_tokens_per_second").get("mean")),
    }


def _timeline_figures(
    timeline: Mapping[str, Any], tokens: int | None
) -> tuple[float | None, float | None, float | None]:
    """TTFT, ITL and end-to-end latency of a server timeline (None where a field lacks)."""
    arrival = _number(timeline.get("arrival_s"))
    first = _number(timeline.get("first_token_s"))
    finished = _number(timeline.get("finished_s"))
    ttft = first - arrival if first is not None and arrival is not None else None
    itl = (
        (finished - first) / (tokens - 1)
        if finished is not None and first is not None and tokens is not None and tokens > 1
        else None
    )
    latency = finished - arrival if finished is not None and arrival is not None else None
    return ttft, itl, latency


def read_loadgen(output: Path) -> tuple[list[Sample], dict[str, Any]]:
    """loadgen's JSON records as samples (end-to-end latency the client's, TTFT and ITL
    from the stack's timeline in each answer) and notes (its errors)."""
    document = json.loads(output.read_text())
    samples: list[Sample] = []
    errors: list[str] = []
    for record in document["requests"]:
        ok = record.get("outcome") == "ok"
        tokens = record.get("completion_tokens")
        ttft, itl, _ = _timeline_figures(record.get("timeline") or {}, tokens)
        sent = _number(record.get("sent_s"))
        latency = _number(record.get("latency_s"))
        samples.append(
            Sample(
                ok=ok,
                ttft_s=ttft,
                itl_s=itl,
                latency_s=latency,
                output_tokens=tokens,
                prompt_tokens=record.get("prompt_tokens"),
                start_s=sent,
                end_s=sent + latency if sent is not None and latency is not None else None,
                send_lag_s=_number(record.get("send_lag_s")),
                request_id=record.get("request_id"),
            )
        )
        if not ok:
            errors.append(f"{record.get('outcome')}: {record.get('error_message')}"[:200])
    return samples, {"errors": sorted(set(errors))[:5]}


def stack_records(url: str, client: ClientRun, save_to: Path) -> ClientRun:
    """The stack's own records of ``client``'s answered requests (``GET
    /v1/requests/{id}``), as samples; the records themselves written to ``save_to``."""
    samples: list[Sample] = []
    records: list[dict[str, Any]] = []
    missing = 0
    with httpx.Client(base_url=url, timeout=30.0) as http:
        for sample in client.samples:
            if not sample.ok or not sample.request_id:
                continue
            response = http.get(f"/v1/requests/{sample.request_id}")
            if response.status_code != 200:
                missing += 1
                continue
            record = response.json()
            records.append(record)
            result = record.get("result") or {}
            tokens = result.get("output_tokens")
            timeline = record.get("timeline") or {}
            ttft, itl, latency = _timeline_figures(timeline, tokens)
            samples.append(
                Sample(
                    ok=record.get("status") == "ok",
                    ttft_s=ttft,
                    itl_s=itl,
                    latency_s=latency,
                    output_tokens=tokens,
                    start_s=_number(timeline.get("arrival_s")),
                    end_s=_number(timeline.get("finished_s")),
                    request_id=sample.request_id,
                )
            )
    save_to.write_text(json.dumps(records))
    return ClientRun(
        name="stack, guidellm's requests",
        samples=samples,
        wall_s=client.wall_s,
        client_cpu_s=0.0,
        stack_cpu_s=None,
        notes={"records_not_found": missing, "json": str(save_to)},
    )


# -- figures -----------------------------------------------------------------------------------


def _quantiles(values: Sequence[float | None]) -> dict[str, float | None]:
    present = np.array([v for v in values if v is not None], dtype=float)
    if present.size == 0:
        return {"p50": None, "p99": None}
    p50, p99 = np.quantile(present, [0.5, 0.99])
    return {"p50": float(p50), "p99": float(p99)}


def row(run: ClientRun, planned: int) -> dict[str, Any]:
    """The table's figures of one client run."""
    ok = [s for s in run.samples if s.ok]
    starts = [s.start_s for s in run.samples if s.start_s is not None]
    ends = [s.end_s for s in ok if s.end_s is not None]
    span = max(ends) - min(starts) if starts and ends else None
    tokens = sum(s.output_tokens or 0 for s in ok)
    figures: dict[str, Any] = {
        "client": run.name,
        "planned": planned,
        "requests": len(run.samples),
        "successful": len(ok),
        "throughput_rps": len(ok) / span if span else None,
        "output_tokens_per_s": tokens / span if span else None,
        "client_cpu_s": run.client_cpu_s,
        "stack_cpu_s": run.stack_cpu_s,
        "send_lag": _quantiles([s.send_lag_s for s in run.samples]),
        "prompt_tokens_mean": (
            statistics.fmean(p) if (p := [s.prompt_tokens for s in ok if s.prompt_tokens]) else None
        ),
        "output_tokens_mean": (
            statistics.fmean(o) if (o := [s.output_tokens for s in ok if s.output_tokens]) else None
        ),
        "notes": run.notes,
    }
    for metric in METRICS:
        figures[metric] = _quantiles([getattr(s, f"{metric}_s") for s in ok])
    return figures


def report_row(run: ClientRun, planned: int) -> dict[str, Any]:
    """The table's figures as guidellm's own report gives them."""
    own: Mapping[str, Any] = run.notes["own_report"]
    figures = row(run, planned)
    figures.update(
        {
            "client": f"guidellm {GUIDELLM_VERSION}, its report",
            "throughput_rps": own["throughput_rps"],
            "output_tokens_per_s": own["output_tokens_per_s"],
            **{metric: own[metric] for metric in METRICS},
        }
    )
    figures["notes"] = {}
    return figures


def client_minus_stack(client: ClientRun, stack: ClientRun) -> dict[str, Any]:
    """Per request: the client's TTFT, ITL and latency minus the stack's (what lies between
    the ingress's arrival stamp and the client: HTTP, the answer's way out, the client)."""
    by_id = {s.request_id: s for s in stack.samples}
    differences: dict[str, list[float]] = {metric: [] for metric in METRICS}
    for sample in client.samples:
        other = by_id.get(sample.request_id)
        if other is None:
            continue
        for metric in METRICS:
            mine, theirs = getattr(sample, f"{metric}_s"), getattr(other, f"{metric}_s")
            if mine is not None and theirs is not None:
                differences[metric].append(mine - theirs)
    return {metric: _quantiles(values) for metric, values in differences.items()}


def _median(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_rows(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each client's figures, the median over the runs (per figure)."""
    names = [r["client"] for r in runs[0]["rows"]]
    medians: list[dict[str, Any]] = []
    for name in names:
        mine = [r for run in runs for r in run["rows"] if r["client"] == name]
        merged: dict[str, Any] = {"client": name}
        for key in (
            "planned",
            "requests",
            "successful",
            "throughput_rps",
            "output_tokens_per_s",
            "client_cpu_s",
            "stack_cpu_s",
        ):
            merged[key] = _median([r[key] for r in mine])
        for metric in (*METRICS, "send_lag"):
            merged[metric] = {q: _median([r[metric][q] for r in mine]) for q in ("p50", "p99")}
        medians.append(merged)
    return medians


# -- text and JSON -----------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| client | requests | successful | TTFT P50 / P99 ms | ITL P50 / P99 ms "
        "| end-to-end P50 / P99 s | throughput req/s | output tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['client']} | {_count(r['requests'])} | {_count(r['successful'])} "
            f"| {_ms(r['ttft']['p50'])} / {_ms(r['ttft']['p99'])} "
            f"| {_ms(r['itl']['p50'])} / {_ms(r['itl']['p99'])} "
            f"| {_s(r['latency']['p50'])} / {_s(r['latency']['p99'])} "
            f"| {_rate(r['throughput_rps'])} | {_rate(r['output_tokens_per_s'])} |"
        )
    return "\n".join(lines)


def gap_line(gap: Mapping[str, Any]) -> str:
    """A run's ``guidellm_minus_stack`` (from :func:`client_minus_stack`) as one line."""
    return (
        "guidellm minus the stack's record, same requests, P50 / P99: TTFT "
        f"{_ms(gap['ttft']['p50'])} / {_ms(gap['ttft']['p99'])} ms, ITL "
        f"{_ms(gap['itl']['p50'])} / {_ms(gap['itl']['p99'])} ms, end-to-end "
        f"{_ms(gap['latency']['p50'])} / {_ms(gap['latency']['p99'])} ms"
    )


def write_document(
    path: Path,
    *,
    config: Mapping[str, Any],
    guidellm: Mapping[str, Any],
    tokenizer: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    medians: Sequence[Mapping[str, Any]],
) -> None:
    """The benchmark's JSON document at ``path``: the machine, the configuration, the
    guidellm environment and tokenizer, every run's rows and the medians."""
    document = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "config": config,
        "guidellm": guidellm,
        "tokenizer": tokenizer,
        "runs": runs,
        "medians": medians,
    }
    path.write_text(json.dumps(document, indent=2))
