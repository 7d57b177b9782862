"""API errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the ingress answers, bad input or not, is an :class:`ApiError`: a status,
a message that names the problem and the field, and the field (``param``) itself, so a
client never sees a traceback or a bare 500 for something it sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"


def error_body(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """An error answer.

    Attributes:
        status: the HTTP status.
        message: names the problem and the field.
        type_: OpenAI error type (``invalid_request_error``, ``not_found_error``,
            ``server_error``).
        param: the offending field (``max_tokens``, ``switchyard.deadline_ms``,
            ``messages[0].content``, a header name), or None.
        code: a short machine-readable code (``invalid_type``, ``missing_field``,
            ``model_not_found``, ``answer_timeout``, ...).
        headers: extra response headers (``Retry-After``, ``X-Switchyard-Request-Id``).
        extra: extra top-level members of the body (``switchyard``: the request's id and
            timeline when there is one).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type_ = type_
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        body = error_body(self.message, type_=self.type_, param=self.param, code=self.code)
        body.update(self.extra)
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, *, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)
