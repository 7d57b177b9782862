"""What the service-time predictor knows about a request before it runs.

A prediction is made per request *and per worker type*: the same request has one
:class:`ServiceTimeFeatures` for every worker type it could run on, differing only in
``gpu``. The service time being predicted is the number of seconds from the start of the
request's prefill to its last token on an otherwise idle worker of that type.

The output length is what drives most of a request's service time, and it is unknown
when the request arrives; the predictor therefore learns the expected service time
given the prompt length and the workload class, and uses ``output_tokens_hint`` only
when a client supplies one.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.contracts.messages import WorkloadType

__all__ = ["WORKLOADS", "ServiceTimeFeatures"]

WORKLOADS: tuple[WorkloadType, ...] = tuple(WorkloadType)
"""Every workload class, in the fixed order the predictors one-hot encode them."""


@dataclass(frozen=True, slots=True)
class ServiceTimeFeatures:
    """One request on one worker type, as the predictor sees it.

    ``prompt_tokens`` and ``output_tokens_hint`` are counts of tokens (never negative);
    ``model`` names the model variant (``"llama-2-7b"``) and ``gpu`` the worker type
    (``"a100-80gb"``). A :class:`ValueError` names a negative count.
    """

    prompt_tokens: int
    workload: WorkloadType
    model: str
    gpu: str
    output_tokens_hint: int | None = None

    def __post_init__(self) -> None:
        # One comparison each: these objects are built in the simulator's hot loop.
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.output_tokens_hint is not None and self.output_tokens_hint < 0:
            raise ValueError(f"output_tokens_hint must be >= 0, got {self.output_tokens_hint}")
