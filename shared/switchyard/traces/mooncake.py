"""The reader for traces in the Mooncake format (kvcache-ai/Mooncake, FAST'25).

One JSON object a line: ``timestamp`` (arrival in milliseconds from the start, a
non-negative number, never going backwards), ``input_length`` and ``output_length``
(prompt and generated tokens, positive integers) and ``hash_ids`` (the prompt's
KV-cache blocks of 512 tokens, as non-negative integer ids; one id per started block).
Two requests whose ``hash_ids`` start with the same run of ids share that prefix, which
is what prefix caching and prefix-aware routing exploit. Other keys are ignored. As
with the Azure reader, the first bad line stops the read with a
:class:`~switchyard.traces.azure.TraceFormatError` naming the file, the line and the
field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from switchyard.contracts.messages import WorkloadType
from switchyard.traces.azure import (
    PREFIX_BLOCK_TOKENS,
    Trace,
    TraceFormatError,
    TraceRequest,
    reading_errors_named,
)

__all__ = ["load_mooncake_trace"]


def load_mooncake_trace(
    path: Path | str,
    *,
    workload: WorkloadType = WorkloadType.CONVERSATION,
    limit: int | None = None,
    name: str | None = None,
) -> Trace:
    """The requests of one Mooncake-format file as a :class:`Trace`.

    Args:
        path: the JSON-lines file.
        workload: the workload class of every request (the format has none).
        limit: read at most this many requests (the first ones); None reads them all.
        name: the trace's name; by default the file name without its suffix.

    Raises:
        TraceFormatError: the file is missing, not UTF-8, has no requests, or a line
            is not a JSON object with valid fields (see the module docstring).
        ValueError: ``limit`` is less than 1.
    """
    path = Path(path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit!r}")
    requests: list[TraceRequest] = []
    with reading_errors_named(path), path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if limit is not None and len(requests) >= limit:
                break
            request = _request(path, line_number, line, workload)
            if requests and request.arrival_s < requests[-1].arrival_s:
                raise TraceFormatError(
                    f"{path}, line {line_number}, timestamp: goes backwards, "
                    f"{request.arrival_s * 1000:g} ms after {requests[-1].arrival_s * 1000:g} ms"
                )
            requests.append(request)
    if not requests:
        raise TraceFormatError(f"{path}: the trace has no requests")
    return Trace.from_requests(name or path.stem, str(path), requests)


def _request(path: Path, line_number: int, line: str, workload: WorkloadType) -> TraceRequest:
    where = f"{path}, line {line_number}"
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in row:
            raise TraceFormatError(f"{where}, {key}: missing")
    stamp = row["timestamp"]
    if (
        isinstance(stamp, bool)
        or not isinstance(stamp, int | float)
        or not (math.isfinite(stamp) and stamp >= 0)
    ):
        raise TraceFormatError(
            f"{where}, timestamp: must be a number of milliseconds >= 0, got {stamp!r}"
        )
    lengths = []
    for key in ("input_length", "output_length"):
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TraceFormatError(f"{where}, {key}: must be a positive integer, got {value!r}")
        lengths.append(value)
    prompt_tokens, output_tokens = lengths
    blocks = row["hash_ids"]
    if not isinstance(blocks, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
    ):
        raise TraceFormatError(f"{where}, hash_ids: must be a list of integers >= 0")
    expected = math.ceil(prompt_tokens / PREFIX_BLOCK_TOKENS)
    if len(blocks) != expected:
        raise TraceFormatError(
            f"{where}, hash_ids: {len(blocks)} ids for {prompt_tokens} prompt tokens; "
            f"expected {expected} (one per {PREFIX_BLOCK_TOKENS}-token block)"
        )
    return TraceRequest(
        arrival_s=stamp / 1000.0,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        workload=workload,
        prefix_blocks=tuple(blocks),
    )
