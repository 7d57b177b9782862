"""Reader for the Azure LLM inference traces (2023): one row per request.

Columns: ``TIMESTAMP`` (naive wall clock with 7 fractional digits), ``ContextTokens``
(prompt length) and ``GeneratedTokens`` (output length). Arrivals are returned as
seconds after the first request of the file.
"""

from __future__ import annotations

import csv
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from switchyard.contracts.messages import WorkloadType

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data"
BUNDLED_SAMPLES = {
    WorkloadType.CODE: BUNDLED_DIR / "azure_code_sample.csv",
    WorkloadType.CONVERSATION: BUNDLED_DIR / "azure_conv_sample.csv",
}


class TraceFormatError(ValueError):
    """A trace file does not have the expected columns or values; the message says where."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of an LLM trace."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    workload: WorkloadType


def _parse_timestamp(text: str) -> datetime:
    # Python's parser takes at most 6 fractional digits; the traces carry 7.
    whole, _, fraction = text.strip().partition(".")
    return datetime.strptime(f"{whole}.{(fraction or '0')[:6]:0<6}", "%Y-%m-%d %H:%M:%S.%f")


def read_azure_trace(
    path: Path, workload: WorkloadType, *, limit: int | None = None
) -> list[TraceRequest]:
    """The requests of one Azure trace file, arrivals relative to its first row.

    Raises:
        TraceFormatError: naming the file and line of the first bad row.
    """
    requests: list[TraceRequest] = []
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        expected = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not expected <= set(reader.fieldnames):
            raise TraceFormatError(
                f"{path}: expected columns {sorted(expected)}, got {reader.fieldnames}"
            )
        start: datetime | None = None
        for line, row in enumerate(reader, start=2):
            if limit is not None and len(requests) >= limit:
                break
            try:
                stamp = _parse_timestamp(row["TIMESTAMP"])
                prompt_tokens = int(row["ContextTokens"])
                output_tokens = int(row["GeneratedTokens"])
            except (TypeError, ValueError) as exc:
                raise TraceFormatError(f"{path}:{line}: {exc}") from None
            start = start or stamp
            requests.append(
                TraceRequest(
                    arrival_s=(stamp - start).total_seconds(),
                    prompt_tokens=max(1, prompt_tokens),
                    output_tokens=max(1, output_tokens),
                    workload=workload,
                )
            )
    return requests


def merge_by_arrival(*traces: Iterable[TraceRequest]) -> Iterator[TraceRequest]:
    """Interleave several traces (each sorted by arrival) into one, by arrival time."""
    return heapq.merge(*traces, key=lambda r: r.arrival_s)


def bundled_mix(limit_per_trace: int | None = None) -> list[TraceRequest]:
    """The bundled code and conversation samples, interleaved by arrival."""
    return list(
        merge_by_arrival(
            *(read_azure_trace(p, w, limit=limit_per_trace) for w, p in BUNDLED_SAMPLES.items())
        )
    )
