"""The field types and the nested-part base every bus message is built from.

:mod:`switchyard.contracts.messages` re-exports them; they live here so that the message
modules (:mod:`~switchyard.contracts.messages`,
:mod:`~switchyard.contracts.prediction_messages`) share them without importing each other.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Identifier = Annotated[str, Field(min_length=1, max_length=192, pattern=r"^[A-Za-z0-9._:/@~-]+$")]
"""Ids of requests, workers, apps: a client's request id (at most 128 characters of
these, ``~`` excepted) scoped by its tenant's name (``tenant~id``) fits."""

FLOAT32_MAX: Final = 3.4028234663852886e38
"""The largest finite 32-bit float: models read features as float32."""

Float32 = Annotated[float, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX, allow_inf_nan=False)]
"""A finite number that stays finite as a 32-bit float (``1e39`` does not)."""
"""Ids and names that end up in keys, topics and logs: no spaces or control characters."""

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is neither infinite nor NaN (JSON has no spelling for either)."""
NonNegativeFiniteFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _check_worker_type(value: str) -> str:
    gpu, _, model = value.partition("/")
    if not gpu or not model:
        raise ValueError(f"a worker type is named GPU/model, got {value!r}")
    return value


WorkerTypeName = Annotated[Identifier, AfterValidator(_check_worker_type)]
"""A worker type, ``GPU/model`` (``a100-80gb/llama-2-7b``): the GPU up to the first ``/``."""

LINEAR_TERMS: Final = 8
"""Terms of the linear service-time model (``switchyard.prediction.linear.TERM_NAMES``)."""


class Part(BaseModel):
    """A nested part of a message: frozen, unknown fields ignored like the message itself."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


PREFIX_BLOCK_TOKENS: Final = 512
"""Tokens per KV block of a prompt's content ids (``LLMPayload.prefix_blocks``, a trace's
``prefix_blocks``): the Mooncake trace format's block."""


class WorkloadType(StrEnum):
    """The workload class of an LLM request, as in the Azure traces."""

    CODE = "code"
    CONVERSATION = "conversation"
    OTHER = "other"
