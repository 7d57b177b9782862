"""Reading a call: its JSON body within limits, and the Switchyard headers.

Every refusal is an OpenAI-shaped :class:`~services.ingress.errors.ApiError` naming
what is wrong: 415 for another content type, 413 beyond the body limit (checked against
``Content-Length`` and while reading), 400 for a body that is not JSON or a header out
of range.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.requests import Request

from services.ingress.errors import ApiError, bad_request

DEADLINE_HEADER = "X-Switchyard-Deadline-Ms"
PRIORITY_HEADER = "X-Switchyard-Priority"


def too_large(limit_bytes: int, size: int | None) -> ApiError:
    what = f"{size} bytes" if size is not None else "more than that"
    return ApiError(
        413,
        f"request body too large: at most {limit_bytes} bytes, got {what}",
        code="body_too_large",
    )


async def json_body(request: Request, limit_bytes: int) -> Any:
    """The body parsed as JSON (see the module docstring for the refusals)."""
    content_type = request.headers.get("content-type")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiError(
                415,
                f"Content-Type must be application/json, got {content_type!r}",
                param="Content-Type",
                code="unsupported_media_type",
            )
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise bad_request(
                f"Content-Length must be a byte count, got {declared!r}", param="Content-Length"
            )
        if int(declared) > limit_bytes:
            raise too_large(limit_bytes, int(declared))
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit_bytes:  # a lying or missing Content-Length: never read unbounded
            raise too_large(limit_bytes, None)
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object", param=None)
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(
            400, f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    # JSON may escape a lone UTF-16 surrogate ("\ud800"), which is no Unicode character:
    # it could be neither counted, encoded nor sent on. Only a body with such an escape is
    # searched (one bytes scan for the rest).
    if _SURROGATE_ESCAPE.search(body) is not None:
        where = _surrogate_path(parsed, "")
        if where is not None:
            raise bad_request(
                f"'{where or 'body'}' contains a lone UTF-16 surrogate escape, which is not "
                f"valid Unicode text",
                param=where or None,
                code="invalid_text",
            )
    return parsed


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_path(value: Any, path: str) -> str | None:
    """The path (``messages[0].content``) of the first string holding a lone surrogate."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) is not None else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key) is not None:
                return path or "body"
            found = _surrogate_path(item, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _header_deadline_ms(request: Request) -> float | None:
    raw = request.headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise bad_request(
            f"header {DEADLINE_HEADER} must be a positive number of milliseconds, got {raw!r}",
            param=DEADLINE_HEADER,
        )
    return value


def _header_priority(request: Request) -> int | None:
    raw = request.headers.get(PRIORITY_HEADER)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isdigit() and 0 <= int(text) <= 1000):
        raise bad_request(
            f"header {PRIORITY_HEADER} must be an integer from 0 to 1000, got {raw!r}",
            param=PRIORITY_HEADER,
        )
    return int(text)


def deadline_and_priority(
    request: Request, deadline_ms: float | None, priority: int | None
) -> tuple[float | None, int]:
    """The call's deadline (ms) and priority: the body's values win over the headers;
    the headers are read (and checked) always."""
    header_deadline = _header_deadline_ms(request)
    header_priority = _header_priority(request)
    deadline = deadline_ms if deadline_ms is not None else header_deadline
    chosen = priority if priority is not None else header_priority
    return deadline, chosen if chosen is not None else 0
