"""The body of a pipeline call (``POST /v1/apps/{pipeline}/infer``), and the checks on
it that need the pipeline.

Strict like every body the ingress reads (no coercion, NaN and infinities refused), and
closed: a field it does not know is refused with 400 ``unknown_field`` naming it, so a
classification body (``features``) sent to a pipeline, or a misspelt option, is not
silently ignored.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from switchyard.multimodel.model import PipelineSpec

from services.ingress.errors import bad_request
from services.ingress.openai_schema import RequestId

MAX_INPUT_CHARS = 4096
"""The longest ``input`` (a stage's inputs and outputs travel in messages of this size)."""
MAX_EXEC_SCALE = 1000.0
"""The largest ``exec_scale`` a stage request carries."""
MAX_STAGE_ID_CHARS = 192
"""The longest request id a stage may have (the bus's identifier limit)."""


class PipelineBody(BaseModel):
    """``POST /v1/apps/{pipeline}/infer``."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    input: Annotated[str, Field(max_length=MAX_INPUT_CHARS)] = Field(
        default="",
        description="The call's input (a prompt): what the pipeline's first stages get, "
        f"as their input named 'input'. At most {MAX_INPUT_CHARS} characters.",
    )
    exec_scale: Annotated[float, Field(gt=0, le=MAX_EXEC_SCALE, allow_inf_nan=False)] = Field(
        default=1.0,
        description="This call's service time relative to its models' means (a trace "
        "row's execution time over its model's mean); > 0, default 1.",
    )
    request_id: RequestId | None = Field(
        default=None,
        description="Client idempotency id: a retry with it runs no stage twice and gets "
        "the call's one answer (each stage is recorded as '{request_id}.{stage}').",
    )


def check_stage_ids(call_id: str, pipeline: PipelineSpec, *, client_id: str | None) -> None:
    """Refuse a call whose stage request ids (``{call_id}.{stage}``) would be longer than
    a request id may be: 400 naming ``request_id`` and how long it may be."""
    longest = max(len(stage.name) for stage in pipeline.stages)
    excess = len(call_id) + 1 + longest - MAX_STAGE_ID_CHARS
    if excess <= 0 or client_id is None:
        # A server-made id is short: a stage name too long for any id is the catalogue's
        # problem, answered where the stage's request is made.
        return
    raise bad_request(
        f"'request_id' is too long for pipeline {pipeline.name!r}: its stages are recorded "
        f"as '{{request_id}}.{{stage}}', at most {MAX_STAGE_ID_CHARS} characters; use at "
        f"most {max(1, len(client_id) - excess)} characters",
        param="request_id",
    )


__all__ = ["MAX_INPUT_CHARS", "PipelineBody", "check_stage_ids"]
