"""The trace types, and the reader for the Azure LLM inference traces (2023).

An Azure trace file has one row per request and the columns ``TIMESTAMP`` (naive wall
clock, ``YYYY-MM-DD HH:MM:SS`` with up to 7 fractional digits), ``ContextTokens``
(prompt length) and ``GeneratedTokens`` (output length). The reader is strict: the
first bad row stops it with a :class:`TraceFormatError` whose one-line message names
the file, the line and the field, so that a broken trace never turns silently into a
different workload.

:class:`Trace` is the common currency of every trace source (these files, the synthetic
generators and the transforms): requests sorted by arrival, the first at 0.0 s.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS as PREFIX_BLOCK_TOKENS
from switchyard.contracts.messages import WorkloadType

BUNDLED_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_SAMPLES = {
    WorkloadType.CODE: BUNDLED_DIR / "azure_code_sample.csv",
    WorkloadType.CONVERSATION: BUNDLED_DIR / "azure_conv_sample.csv",
}

TIMESTAMP = "TIMESTAMP"
CONTEXT_TOKENS = "ContextTokens"
GENERATED_TOKENS = "GeneratedTokens"
AZURE_COLUMNS = (TIMESTAMP, CONTEXT_TOKENS, GENERATED_TOKENS)

# Anchored and explicit rather than datetime.fromisoformat: that one also takes dates
# without a time, offsets and week dates, none of which belong in these traces.
_TIMESTAMP_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\Z", re.ASCII
)


class TraceFormatError(ValueError):
    """A trace file is missing, empty or malformed; the one-line message says where."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        arrival_s: seconds after the first request of the trace (>= 0).
        prompt_tokens: prompt length (>= 1).
        output_tokens: output length (>= 1).
        workload: the workload class the request belongs to.
        prefix_blocks: the prompt's KV-cache blocks of :data:`PREFIX_BLOCK_TOKENS`
            tokens each, as content ids: two requests whose lists start with the same
            ids share that prefix (empty: not known, nothing shared).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    workload: WorkloadType
    prefix_blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"arrival_s must be a finite number >= 0, got {self.arrival_s!r}")
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens!r}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens!r}")


@dataclass(frozen=True, slots=True)
class Trace:
    """A named, non-empty sequence of requests, sorted by arrival, the first at 0.0 s.

    Attributes:
        name: short name for tables and plots (``azure-conv``, ``poisson(...)``).
        source: where the requests came from: the file that was read, or a description
            of the generator and its parameters, so that a report can state it.
        requests: the requests, arrivals non-decreasing and relative to the first.

    Raises:
        ValueError: on construction, when ``requests`` is empty, does not start at 0.0
            or is not sorted by arrival. :meth:`from_requests` sorts and rebases.
    """

    name: str
    source: str
    requests: tuple[TraceRequest, ...]

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError(f"trace {self.name!r} has no requests")
        if self.requests[0].arrival_s != 0.0:
            raise ValueError(
                f"trace {self.name!r}: the first arrival must be 0.0 s, "
                f"got {self.requests[0].arrival_s!r}"
            )
        for index in range(1, len(self.requests)):
            if self.requests[index].arrival_s < self.requests[index - 1].arrival_s:
                raise ValueError(
                    f"trace {self.name!r}: request {index} arrives before request {index - 1}"
                )

    @classmethod
    def from_requests(cls, name: str, source: str, requests: Iterable[TraceRequest]) -> Trace:
        """A trace of ``requests`` in any order: sorted (stably) and rebased to start at 0.0."""
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        if not ordered:
            raise ValueError(f"trace {name!r} has no requests")
        start_s = ordered[0].arrival_s
        if start_s != 0.0:
            ordered = [replace(r, arrival_s=r.arrival_s - start_s) for r in ordered]
        return cls(name=name, source=source, requests=tuple(ordered))

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    @property
    def duration_s(self) -> float:
        """Seconds from the first arrival to the last (0.0 for a single request)."""
        return self.requests[-1].arrival_s

    @property
    def mean_rate_rps(self) -> float:
        """Arrivals per second: inter-arrival gaps over the span, ``(len - 1) / duration_s``.

        This is the reciprocal of the mean inter-arrival time, so it estimates a
        generator's rate without the off-by-one of ``len / duration_s``. A single
        request gives 0.0; several requests all at 0.0 s give ``inf``.
        """
        gaps = len(self.requests) - 1
        if gaps == 0:
            return 0.0
        if self.duration_s == 0.0:
            return math.inf
        return gaps / self.duration_s

    def inter_arrivals_s(self) -> list[float]:
        """The ``len - 1`` gaps between consecutive arrivals, in seconds."""
        arrivals_s = [r.arrival_s for r in self.requests]
        return [later - earlier for earlier, later in itertools.pairwise(arrivals_s)]


def _parse_timestamp(text: str) -> tuple[datetime, float] | None:
    """The whole seconds and the fraction of an Azure timestamp, or None if it is not one.

    The fraction is kept apart because :class:`datetime` holds microseconds and the
    traces carry 7 fractional digits.
    """
    match = _TIMESTAMP_RE.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        whole = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError:  # month 13, February 30th, second 61, ...
        return None
    return whole, float(f"0.{fraction}") if fraction else 0.0


def _positive_int(text: str) -> int | None:
    # int() alone would also take " 7", "+7" and "1_000"; a trace has plain digits.
    if text.isascii() and text.isdigit():
        value = int(text)
        if value > 0:
            return value
    return None


def load_azure_trace(
    path: Path | str,
    workload: WorkloadType,
    *,
    limit: int | None = None,
    name: str | None = None,
) -> Trace:
    """The requests of one Azure trace file as a :class:`Trace`.

    Args:
        path: the CSV file; extra columns are allowed and ignored.
        workload: the workload class of every request of the file.
        limit: read at most this many requests (the first ones); None reads them all.
        name: the trace's name; by default the file name without its suffix.

    Returns:
        The trace, arrivals in seconds after the file's first row, its ``source`` the
        path that was read.

    Raises:
        TraceFormatError: the file is missing, not UTF-8, empty, lacks a column, has
            no rows, or a row has a bad timestamp, a token count that is not a positive
            integer, the wrong number of fields, or a timestamp earlier than the row
            before; the message names the file, the line and the field.
        ValueError: ``limit`` is less than 1.
    """
    path = Path(path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit!r}")
    with reading_errors_named(path), path.open(newline="", encoding="utf-8-sig") as handle:
        requests = _read_rows(path, handle, workload, limit)
    return Trace(name=name or path.stem, source=str(path), requests=tuple(requests))


@contextmanager
def reading_errors_named(path: Path) -> Iterator[None]:
    """Turn a missing file, a directory or bytes that are not UTF-8 met while reading
    the trace file ``path`` into a one-line :class:`TraceFormatError`."""
    try:
        yield
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory, not a trace file") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _read_rows(
    path: Path, handle: Iterable[str], workload: WorkloadType, limit: int | None
) -> list[TraceRequest]:
    # csv.reader with column indices rather than DictReader: it is several times faster
    # on the 19k-row conversation trace, and reader.line_num stays right for quoted
    # fields that span lines.
    reader = csv.reader(handle, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(
                f"{path}: the file is empty; expected the header {','.join(AZURE_COLUMNS)}"
            )
        header = [column.strip() for column in header]
        for column in AZURE_COLUMNS:
            if header.count(column) != 1:
                problem = "missing column" if column not in header else "duplicate column"
                raise TraceFormatError(
                    f"{path}, line {reader.line_num}, {column}: {problem} "
                    f"(header: {','.join(header)!r}; expected {','.join(AZURE_COLUMNS)})"
                )
        at_stamp, at_prompt, at_output = (header.index(column) for column in AZURE_COLUMNS)
        width = len(header)

        requests: list[TraceRequest] = []
        start: tuple[datetime, float] | None = None
        previous: tuple[datetime, float, str, int] | None = None
        for row in reader:
            if not row:  # a blank line, as csv.DictReader would skip it
                continue
            if limit is not None and len(requests) >= limit:
                break
            line = reader.line_num
            if len(row) != width:
                raise TraceFormatError(
                    f"{path}, line {line}, row: expected {width} fields, got {len(row)}"
                )
            stamp_text = row[at_stamp]
            stamp = _parse_timestamp(stamp_text)
            if stamp is None:
                raise TraceFormatError(
                    f"{path}, line {line}, {TIMESTAMP}: expected a date and time "
                    f"'YYYY-MM-DD HH:MM:SS[.fraction]', got {stamp_text!r}"
                )
            prompt_tokens = _positive_int(row[at_prompt])
            if prompt_tokens is None:
                raise TraceFormatError(
                    f"{path}, line {line}, {CONTEXT_TOKENS}: must be a positive integer, "
                    f"got {row[at_prompt]!r}"
                )
            output_tokens = _positive_int(row[at_output])
            if output_tokens is None:
                raise TraceFormatError(
                    f"{path}, line {line}, {GENERATED_TOKENS}: must be a positive integer, "
                    f"got {row[at_output]!r}"
                )
            whole, fraction = stamp
            if previous is not None and (whole, fraction) < previous[:2]:
                raise TraceFormatError(
                    f"{path}, line {line}, {TIMESTAMP}: goes backwards, {stamp_text!r} is "
                    f"earlier than {previous[2]!r} on line {previous[3]}"
                )
            previous = (whole, fraction, stamp_text, line)
            if start is None:
                start = stamp
            requests.append(
                TraceRequest(
                    arrival_s=(whole - start[0]).total_seconds() + (fraction - start[1]),
                    prompt_tokens=prompt_tokens,
                    output_tokens=output_tokens,
                    workload=workload,
                )
            )
    except csv.Error as exc:
        raise TraceFormatError(f"{path}, line {reader.line_num}, row: {exc}") from None
    if not requests:
        raise TraceFormatError(f"{path}: the trace has no requests")
    return requests


def read_azure_trace(
    path: Path, workload: WorkloadType, *, limit: int | None = None
) -> list[TraceRequest]:
    """The requests of one Azure trace file, arrivals relative to its first row.

    The list form of :func:`load_azure_trace`, with the same validation.

    Raises:
        TraceFormatError: naming the file, line and field of the first bad row.
    """
    return list(load_azure_trace(path, workload, limit=limit).requests)


def merge_by_arrival(*traces: Iterable[TraceRequest]) -> Iterator[TraceRequest]:
    """Interleave several request sequences (each sorted by arrival) by arrival time.

    Ties keep the order of the arguments, so the result is deterministic.
    """
    return heapq.merge(*traces, key=lambda r: r.arrival_s)


def bundled_mix(limit_per_trace: int | None = None) -> list[TraceRequest]:
    """The bundled code and conversation samples, interleaved by arrival.

    Each sample's arrivals are relative to its own first row, so both start at 0.0 s.
    """
    return list(
        merge_by_arrival(
            *(read_azure_trace(p, w, limit=limit_per_trace) for w, p in BUNDLED_SAMPLES.items())
        )
    )


def bundled_sample(workload: WorkloadType) -> Trace:
    """The bundled 1,000-request sample of the code or conversation trace.

    Raises:
        KeyError: there is no bundled sample for ``workload`` (``OTHER``).
    """
    path = BUNDLED_SAMPLES[workload]
    name = "azure-code-sample" if workload is WorkloadType.CODE else "azure-conv-sample"
    return load_azure_trace(path, workload, name=name)
