"""The service runtime: lifecycle, supervised routines, health endpoint, graceful drain.

See :func:`run_service` for the lifecycle and :mod:`switchyard.runtime.service` for the
exit codes.
"""

from switchyard.runtime.connections import backoff_s
from switchyard.runtime.health import DEFAULT_CHECK_TIMEOUT_S, HealthServer, ReadinessCheck
from switchyard.runtime.service import (
    DEFAULT_CONNECT_TIMEOUT_S,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    ContextBuilder,
    Service,
    ServiceContext,
    build_default_context,
    main_for,
    run_service,
)

__all__ = [
    "DEFAULT_CHECK_TIMEOUT_S",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "ContextBuilder",
    "HealthServer",
    "ReadinessCheck",
    "Service",
    "ServiceContext",
    "backoff_s",
    "build_default_context",
    "main_for",
    "run_service",
]
