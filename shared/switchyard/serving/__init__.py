"""What the live stack serves: the catalogue of applications every service reads.

:mod:`switchyard.serving.catalogue` joins the application registry (classification
applications with their profiled variants, LLM applications) into one read-only view
that the ingress validates against, the scheduler decides over and workers load from.
"""

from switchyard.serving.catalogue import (
    DEFAULT_LLM_APPLICATIONS,
    TINY_LM_MODEL,
    ClassificationApplication,
    LlmApplication,
    ServingCatalogue,
    UnknownServedApplicationError,
)

__all__ = [
    "DEFAULT_LLM_APPLICATIONS",
    "TINY_LM_MODEL",
    "ClassificationApplication",
    "LlmApplication",
    "ServingCatalogue",
    "UnknownServedApplicationError",
]
