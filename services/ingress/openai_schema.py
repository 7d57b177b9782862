"""The request bodies the ingress accepts, as strict pydantic models, and how a
validation failure becomes a 400 that names the field.

Validation is strict: no coercion (``"16"`` is not a number, ``1`` is not ``true``), NaN
and infinities are refused. Unknown top-level fields are ignored (OpenAI clients send
``temperature``, ``top_p``, ``seed``, ... which change which tokens a model picks, not the
shape of the answer); unknown fields inside the ``switchyard`` block, and in a
classification call's body (:class:`InferBody`), are refused, so a misspelt option is not
silently dropped. OpenAI parameters that would change the shape
of the answer and that Switchyard does not honour (:data:`UNSUPPORTED_CHAT`,
:data:`UNSUPPORTED_COMPLETION`: several choices, log probabilities, echo, stop
sequences, tools, structured output) are refused with 400 ``unsupported_parameter``
naming the parameter, unless they carry their neutral value (``n: 1``, ``stop: null``,
``response_format: {"type": "text"}``, ...), rather than answered as if they were
honoured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from switchyard.contracts.messages import FLOAT32_MAX, Float32

from services.ingress.errors import ApiError, bad_request

_StrictT = TypeVar("_StrictT", bound=BaseModel)

MAX_TOKENS_DEFAULT = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions``."""

RequestId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:/@-]+$",
        description="Client idempotency id: letters, digits and ._:/@- only, at most 128.",
    ),
]
DeadlineMs = Annotated[
    float,
    Field(
        gt=0,
        allow_inf_nan=False,
        description="Relative deadline in milliseconds from arrival; must be > 0.",
    ),
]
Priority = Annotated[int, Field(ge=0, le=1000, description="0 (default) .. 1000.")]
TokenCount = Annotated[int, Field(ge=1, le=1_000_000)]


def _absent_or(*neutral: object) -> Callable[[object], bool]:
    """A test that a parameter's value is None or one of ``neutral`` (by type as well:
    ``True`` is not ``1``)."""
    return lambda value: (
        value is None or any(type(value) is type(n) and value == n for n in neutral)
    )


Unsupported = Mapping[str, tuple[Callable[[object], bool], str]]
"""Parameter -> (is its value neutral, what Switchyard does instead)."""

UNSUPPORTED_CHAT: Unsupported = {
    "n": (_absent_or(1), "one choice is generated per request; send n=1"),
    "logprobs": (_absent_or(False), "log probabilities are not returned"),
    "top_logprobs": (_absent_or(0), "log probabilities are not returned"),
    "stop": (_absent_or("", []), "stop sequences are not applied"),
    "tools": (_absent_or([]), "tool calling is not supported"),
    "tool_choice": (_absent_or("none"), "tool calling is not supported"),
    "functions": (_absent_or([]), "function calling is not supported"),
    "function_call": (_absent_or("none"), "function calling is not supported"),
    "response_format": (_absent_or({"type": "text"}), "answers are plain text"),
}
"""OpenAI chat parameters refused unless neutral (module docstring)."""

UNSUPPORTED_COMPLETION: Unsupported = {
    **{key: UNSUPPORTED_CHAT[key] for key in ("n", "stop")},
    "logprobs": (_absent_or(), "log probabilities are not returned"),
    "best_of": (_absent_or(1), "one choice is generated per request; send best_of=1"),
    "echo": (_absent_or(False), "the prompt is not echoed"),
    "suffix": (_absent_or(""), "a suffix after the completion is not supported"),
}
"""OpenAI completion parameters refused unless neutral (module docstring)."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    UNSUPPORTED: ClassVar[Unsupported] = {}


class SwitchyardOptions(_Strict):
    """The ``switchyard`` block of an OpenAI-compatible request."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None
    prompt_tokens: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        default=None,
        description="The prompt's token count, when the client knows only the length "
        "(trace replay); wins over the count approximated from the text.",
    )
    output_tokens_hint: TokenCount | None = Field(
        default=None, description="Expected output length (capped at max_tokens)."
    )
    workload: Literal["code", "conversation", "other"] | None = Field(
        default=None,
        description="The request's workload class, a feature of the service-time "
        "predictor; default: the application's.",
    )
    request_id: RequestId | None = None
    prefix_blocks: (
        Annotated[list[Annotated[int, Field(ge=0, lt=2**63)]], Field(max_length=20_000)] | None
    ) = Field(
        default=None,
        description="Content ids of the prompt's KV blocks of 512 tokens, when the client "
        "sends no text (trace replay: the Mooncake format's hash_ids); default: hashed "
        "from the prompt text.",
    )


class StreamOptions(_Strict):
    """OpenAI's ``stream_options``."""

    include_usage: bool | None = Field(
        default=None,
        description="Send the token usage in one last chunk with no choices (OpenAI's "
        "behaviour); without it a stream carries no usage.",
    )


class CompletionBody(_Strict):
    """``POST /v1/completions``."""

    model: Annotated[str, Field(min_length=1)]
    prompt: str | None = Field(
        default=None,
        description="One prompt string (a list of prompts is refused). May be left out "
        "when switchyard.prompt_tokens is given.",
    )
    max_tokens: TokenCount | None = MAX_TOKENS_DEFAULT
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    switchyard: SwitchyardOptions | None = None

    UNSUPPORTED: ClassVar[Unsupported] = UNSUPPORTED_COMPLETION


class TextPart(_Strict):
    """One part of a message's content given as a list (only text parts)."""

    type: Literal["text"]
    text: str


ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ChatMessage(_Strict):
    role: ChatRole
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_Strict):
    """``POST /v1/chat/completions``."""

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: TokenCount | None = MAX_TOKENS_DEFAULT
    max_completion_tokens: TokenCount | None = Field(
        default=None, description="OpenAI's newer name for max_tokens; wins when given."
    )
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    switchyard: SwitchyardOptions | None = None

    UNSUPPORTED: ClassVar[Unsupported] = UNSUPPORTED_CHAT


class InferBody(_Strict):
    """``POST /v1/apps/{app}/infer``: Switchyard's own body, so an unknown field is
    refused by name (as a pipeline call's is), not ignored as an OpenAI client's extras
    are: a ``switchyard`` block or a misspelt ``deadline_ms`` would otherwise leave the
    call on its application's default deadline without a word."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    # Float32: the models read features as 32-bit floats, where 1e39 is infinite.
    features: Annotated[list[Float32], Field(min_length=1)]
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None
    request_id: RequestId | None = None


def param_of(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: ``messages[0].content``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


_TYPE_ERRORS = ("_type", "_parsing", "literal_error", "union_tag", "is_instance_of")


def validation_error(exc: ValidationError) -> ApiError:
    """The 400 for the first problem pydantic found, naming its field."""
    error = exc.errors(include_url=False)[0]
    loc = _without_union_branches(error["loc"])
    param = param_of(loc) or None
    kind = error["type"]
    message = error["msg"]
    if kind == "missing":
        return bad_request(f"missing required field '{param}'", param=param, code="missing_field")
    if kind == "extra_forbidden":
        return bad_request(f"unknown field '{param}'", param=param, code="unknown_field")
    if param == "prompt" and isinstance(error.get("input"), list):
        return bad_request(
            "'prompt' must be a single string; a list of prompts is not supported",
            param=param,
            code="invalid_type",
        )
    if kind in ("finite_number",):
        message = "must be a finite number (NaN and infinities are refused)"
    elif (
        param is not None
        and param.startswith("features")
        and kind
        in (
            "greater_than_equal",
            "less_than_equal",
        )
    ):
        message = f"must fit a 32-bit float (between -{FLOAT32_MAX:.7g} and {FLOAT32_MAX:.7g})"
    code = "invalid_type" if any(t in kind for t in _TYPE_ERRORS) else "invalid_value"
    return bad_request(f"invalid '{param}': {message}", param=param, code=code)


def _without_union_branches(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Pydantic names the union member it tried (``str``, ``list[TextPart]``) inside the
    location; a client wants the field only."""
    return tuple(
        part
        for part in loc
        if not (isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part))
    )


def parse(model: type[_StrictT], data: Any) -> _StrictT:
    """``data`` validated as ``model``; raises the 400 :class:`ApiError` naming the field."""
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object", param=None, code="invalid_type")
    unsupported: Unsupported = getattr(model, "UNSUPPORTED", {})
    for name, (neutral, instead) in unsupported.items():
        if name in data and not neutral(data[name]):
            raise bad_request(
                f"'{name}' is not supported: {instead}",
                param=name,
                code="unsupported_parameter",
            )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
