"""Every multi-model policy by name: a placement policy and the router that goes with it.

One line each, shared by the simulator and (later) the live scheduler. A fresh policy is
built on every call, so a run never inherits another run's state (``static-rr`` keeps
its initial plan on the instance).

==============  ======================================  ===================
name            placement                               router
==============  ======================================  ===================
adaptive        greedy ``alpha*D + beta*U``             balanced-work
adaptive-bal    the same plus ``gamma*CoV(load)``       balanced-work
static-rr       round-robin once, never changed         round-robin
threshold       add/evict on queue and utilisation      jsq
least-loaded    replicas ~ demand, least-loaded worker  least-work
gaps            as least-loaded                         GAPS hybrid
==============  ======================================  ===================

``grouped`` is not registered; :mod:`switchyard.multimodel.policies` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from switchyard.multimodel.adaptive import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    AdaptiveConfig,
    AdaptivePlacement,
)
from switchyard.multimodel.placement_baselines import (
    LeastLoadedPlacement,
    StaticRoundRobinPlacement,
    ThresholdPlacement,
)
from switchyard.multimodel.routing import (
    BalancedWorkRouter,
    GapsHybridRouter,
    JoinShortestQueueRouter,
    LeastWorkRouter,
    RoundRobinRouter,
)
from switchyard.multimodel.snapshot import PlacementPolicy, Router

__all__ = [
    "MultiModelPolicy",
    "UnknownMultiModelPolicyError",
    "make_multimodel_policy",
    "multimodel_policy_names",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiModelPolicy:
    """A named multi-model policy as the shells run it."""

    name: str
    summary: str
    placement: PlacementPolicy
    router: Router


class UnknownMultiModelPolicyError(ValueError):
    """A multi-model policy name that is not registered; the message lists the known ones."""


_Build = Callable[[float, float], MultiModelPolicy]

_REGISTRY: dict[str, _Build] = {
    "adaptive": lambda alpha, beta: MultiModelPolicy(
        name="adaptive",
        summary="greedy placement minimising alpha*D + beta*U, balanced-work routing",
        placement=AdaptivePlacement(AdaptiveConfig(alpha=alpha, beta=beta, gamma=0.0)),
        router=BalancedWorkRouter(),
    ),
    "adaptive-balanced": lambda alpha, beta: MultiModelPolicy(
        name="adaptive-balanced",
        summary="adaptive plus a load-balance term gamma*CoV(predicted worker load)",
        placement=AdaptivePlacement(
            AdaptiveConfig(alpha=alpha, beta=beta), name="adaptive-balanced"
        ),
        router=BalancedWorkRouter(),
    ),
    "static-rr": lambda alpha, beta: MultiModelPolicy(
        name="static-rr",
        summary="round-robin placement by popularity at the start, never changed",
        placement=StaticRoundRobinPlacement(),
        router=RoundRobinRouter(),
    ),
    "threshold": lambda alpha, beta: MultiModelPolicy(
        name="threshold",
        summary="add a replica above a queue/utilisation threshold, evict idle ones below",
        placement=ThresholdPlacement(),
        router=JoinShortestQueueRouter(),
    ),
    "least-loaded": lambda alpha, beta: MultiModelPolicy(
        name="least-loaded",
        summary="replicas proportional to demand x exec time, each on the least-loaded worker",
        placement=LeastLoadedPlacement(),
        router=LeastWorkRouter(),
    ),
    "gaps": lambda alpha, beta: MultiModelPolicy(
        name="gaps",
        summary="least-loaded placement, GAPS hybrid routing (JSQ, least predicted work)",
        placement=LeastLoadedPlacement(name="gaps"),
        router=GapsHybridRouter(),
    ),
}


def multimodel_policy_names() -> list[str]:
    """Registered names, in the order tables list them (the adaptive policy first)."""
    return list(_REGISTRY)


def make_multimodel_policy(
    name: str, *, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> MultiModelPolicy:
    """A fresh instance of the policy registered as ``name``. ``alpha`` and ``beta``
    weigh delay and resource cost for ``adaptive``; the baselines ignore them.

    Example:
        >>> make_multimodel_policy("adaptive", beta=1.0).placement.name
        'adaptive'

    Raises:
        UnknownMultiModelPolicyError: naming ``name`` and every known policy.
        ValueError: ``alpha`` or ``beta`` negative or not finite.
    """
    try:
        build = _REGISTRY[name]
    except KeyError:
        raise UnknownMultiModelPolicyError(
            f"unknown multi-model policy {name!r}: known policies are {', '.join(_REGISTRY)}"
        ) from None
    return build(alpha, beta)
