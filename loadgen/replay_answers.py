"""Reading the ingress's answer to one replayed request into a record's fields.

:func:`parse_answer` is tolerant of anything: a body that is not JSON, or a field of the
ingress's contract that is missing, null or of the wrong type, only leaves that field
out; ``outcome`` is always given. A 2xx answer is ``ok``; a 429 or 503 is ``rejected``
(never retried; a numeric Retry-After is kept); any other status is ``http_error``. An
answer without a timeline is simply left out of the latency breakdown.

A pipeline call's answer (``"object": "pipeline.result"``) gives its SLO verdict as
``slo_s`` and ``met_slo``: ``met_slo`` is kept as ``deadline_met``, so the summary judges
pipeline calls as it judges the others, and ``slo_s`` (a duration, not a time) as
``slo_s``. Its ``latency_s`` (the ingress's) is ``server_latency_s`` and its ``stages``
are kept whole (:func:`~loadgen.replay_records.read_stages`); it has no timeline. A
failed stage answers an OpenAI error naming the stage, read as any error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from loadgen.replay_records import (
    HTTP_ERROR,
    OK,
    REJECTED,
    read_number,
    read_stages,
    read_timeline,
)

__all__ = [
    "EMULATED_HEADER",
    "REJECTED_STATUS_CODES",
    "parse_answer",
]

REJECTED_STATUS_CODES = frozenset({429, 503})
EMULATED_HEADER = "x-switchyard-emulated"
"""The ingress's header naming an emulated answer; read when the body does not say."""


def _integer(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    return str(value)


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare, and the replay does not retry anyway
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def parse_answer(
    kind: str, status_code: int, content: bytes, headers: Mapping[str, str]
) -> dict[str, Any]:
    """The :class:`RequestRecord` fields an HTTP answer gives, tolerant of anything.

    A body that is not JSON, or a field that is missing, null or of the wrong type,
    leaves the field out; only ``outcome`` is always present. An error body's
    ``switchyard`` block, when the ingress adds one, is read like an answer's (its
    timeline is kept but never enters the breakdown, which takes 2xx answers only).

    Args:
        kind: ``llm`` (OpenAI completion with a ``switchyard`` object),
            ``classification`` (the fields at the top level) or ``pipeline`` (a
            ``pipeline.result``, its fields at the top level).
        status_code: the HTTP status.
        content: the raw body.
        headers: the response headers (``httpx.Headers``, or a dict with lower-case keys).
    """
    fields: dict[str, Any] = {}
    if 200 <= status_code < 300:
        fields["outcome"] = OK
    elif status_code in REJECTED_STATUS_CODES:
        fields["outcome"] = REJECTED
        retry = _retry_after_s(headers)
        if retry is not None:
            fields["retry_after_s"] = retry
    else:
        fields["outcome"] = HTTP_ERROR
    try:
        body = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        if fields["outcome"] != OK:
            snippet = content[:200].decode("utf-8", "replace").strip()
            fields["error_message"] = snippet or None
        return {key: value for key, value in fields.items() if value is not None}
    meta: Mapping[str, Any]
    if fields["outcome"] != OK:
        error = body.get("error")
        if isinstance(error, Mapping):
            fields["error_type"] = _text(error.get("type"))
            fields["error_message"] = _text(error.get("message"))
            fields["error_code"] = _text(error.get("code"))
        # The ingress may add its ``switchyard`` block to an error (a missed deadline,
        # an answer timeout): who served it and whether it was emulated still count.
        raw_meta = body.get("switchyard")
        meta = raw_meta if isinstance(raw_meta, Mapping) else {}
        fields["server_status"] = _text(meta.get("status"))
    elif kind == "llm":
        raw_meta = body.get("switchyard")
        meta = raw_meta if isinstance(raw_meta, Mapping) else {}
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            fields["completion_tokens"] = _integer(usage.get("completion_tokens"))
        fields["server_status"] = _text(meta.get("status"))
    elif kind == "pipeline":
        meta = body
        fields["slo_s"] = read_number(body.get("slo_s"))
        fields["deadline_met"] = _flag(body.get("met_slo"))
        fields["server_latency_s"] = read_number(body.get("latency_s"))
        fields["stages"] = read_stages(body.get("stages"))
    else:
        meta = body
        fields["label"] = _integer(body.get("label"))
        fields["class_name"] = _text(body.get("class_name"))
    fields["worker_id"] = _text(meta.get("worker_id"))
    fields["worker_type"] = _text(meta.get("worker_type"))
    fields["variant"] = _text(meta.get("variant"))
    emulated = _flag(meta.get("emulated"))
    if emulated is None and EMULATED_HEADER in headers:
        emulated = str(headers[EMULATED_HEADER]).strip().lower() == "true"
    fields["emulated"] = emulated
    fields["deadline_s"] = read_number(meta.get("deadline_s"))
    if "deadline_met" not in fields:  # a pipeline's is its met_slo, read above
        fields["deadline_met"] = _flag(meta.get("deadline_met"))
    fields["timeline"] = read_timeline(meta.get("timeline"))
    return {key: value for key, value in fields.items() if value is not None}
