"""The service runtime: lifecycle, supervised routines, health endpoint, graceful drain."""

from switchyard.runtime.health import HealthServer, ReadinessCheck
from switchyard.runtime.service import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    Service,
    ServiceContext,
    build_default_context,
    main_for,
    run_service,
)

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "HealthServer",
    "ReadinessCheck",
    "Service",
    "ServiceContext",
    "build_default_context",
    "main_for",
    "run_service",
]
