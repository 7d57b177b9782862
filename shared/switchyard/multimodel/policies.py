"""Multi-model placement policies and routers, in one import.

Placement (:class:`~switchyard.multimodel.snapshot.PlacementPolicy`), at each update:
``adaptive`` (:mod:`~switchyard.multimodel.adaptive`), and the baselines ``static-rr``,
``threshold`` and ``least-loaded`` (:mod:`~switchyard.multimodel.placement_baselines`).
Routing (:class:`~switchyard.multimodel.snapshot.Router`), for each ready stage:
``least-work``, ``jsq``, ``round-robin`` and the GAPS hybrid
(:mod:`~switchyard.multimodel.routing`). Named bundles of the two:
:mod:`~switchyard.multimodel.policy_registry`.

The papers' other policies, where they apply:

- GAPS applies as routing: its hybrid assignment (join the shortest queue while lightly
  used, least predicted work plus the stage's own service time above) is the ``gaps``
  router, where "work" is the replica's queued stages times ``exec_s / speed``; placement
  is least-loaded's, as GAPS has no placement of its own. Its selective rebalancing does
  not carry over: a queued stage here is not bound to a worker's KV cache, and an evicted
  replica's queue is re-routed by the shell anyway.
- Grouped scheduling (SneakPeek) does not apply cleanly, and is not registered. Its gain
  comes from running a group of requests of one application as one batch with one model
  variant, paying the swap-in once per group, in a short window on one worker. Here a
  replica serves one stage at a time (no batching in the contract: ``running`` is at
  most one per replica), a resident model pays no swap per stage, and there is no
  choice of variant: the "group by model on one worker" it would amount to is what
  placement already does (a model's stages go only to its holders). A grouped variant
  would need batched execution (a per-model batch latency profile) in the snapshot and
  the simulator first.
"""

from __future__ import annotations

from switchyard.multimodel.adaptive import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    AdaptiveConfig,
    AdaptivePlacement,
    model_delay,
    placement_cost,
)
from switchyard.multimodel.placement_baselines import (
    LeastLoadedConfig,
    LeastLoadedPlacement,
    StaticRoundRobinPlacement,
    ThresholdConfig,
    ThresholdPlacement,
)
from switchyard.multimodel.routing import (
    GapsHybridRouter,
    JoinShortestQueueRouter,
    LeastWorkRouter,
    RoundRobinRouter,
)

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "AdaptiveConfig",
    "AdaptivePlacement",
    "GapsHybridRouter",
    "JoinShortestQueueRouter",
    "LeastLoadedConfig",
    "LeastLoadedPlacement",
    "LeastWorkRouter",
    "RoundRobinRouter",
    "StaticRoundRobinPlacement",
    "ThresholdConfig",
    "ThresholdPlacement",
    "model_delay",
    "placement_cost",
]
