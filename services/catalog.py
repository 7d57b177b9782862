"""Every service by name, and how to build it.

Imports are deferred to the moment a service is built, so a process running the
ingress or the monitor never imports torch, scikit-learn or faiss.
"""

from __future__ import annotations

from collections.abc import Callable

from switchyard.runtime.service import ServiceFactory

SERVICE_NAMES: tuple[str, ...] = (
    "ingress",
    "monitor",
    "predictor",
    "estimator",
    "scheduler",
    "rebalancer",
    "placement",
    "worker",
)


class UnknownServiceError(ValueError):
    """A service name that does not exist; the message lists the known ones."""


def _ingress() -> ServiceFactory:
    from services.ingress import create

    return create


def _monitor() -> ServiceFactory:
    from services.monitor import create

    return create


def _predictor() -> ServiceFactory:
    from services.predictor import create

    return create


def _estimator() -> ServiceFactory:
    from services.estimator import create

    return create


def _scheduler() -> ServiceFactory:
    from services.scheduler import create

    return create


def _rebalancer() -> ServiceFactory:
    from services.rebalancer import create

    return create


def _placement() -> ServiceFactory:
    from services.placement import create

    return create


def _worker() -> ServiceFactory:
    from services.worker import create

    return create


_FACTORIES: dict[str, Callable[[], ServiceFactory]] = {
    "ingress": _ingress,
    "monitor": _monitor,
    "predictor": _predictor,
    "estimator": _estimator,
    "scheduler": _scheduler,
    "rebalancer": _rebalancer,
    "placement": _placement,
    "worker": _worker,
}


def service_factory(name: str) -> ServiceFactory:
    """The factory of service ``name`` (its module is imported now).

    Raises:
        UnknownServiceError: naming the known services.
    """
    make = _FACTORIES.get(name)
    if make is None:
        raise UnknownServiceError(f"unknown service {name!r}; services: {', '.join(SERVICE_NAMES)}")
    return make()
