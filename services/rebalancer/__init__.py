"""The rebalancer service: the policy's rebalancer over the monitor's state, publishing
migrations. Run it with ``python -m services.rebalancer``; see
:mod:`services.rebalancer.service`.
"""

from __future__ import annotations

from switchyard.runtime.service import Service, ServiceContext

from services.rebalancer.service import RebalancerService
from services.rebalancer.snapshot import build_rebalance_snapshot, listed_entries

__all__ = ["RebalancerService", "build_rebalance_snapshot", "create", "listed_entries"]


async def create(ctx: ServiceContext) -> Service:
    """The rebalancer for ``ctx`` (not started: the runtime calls ``start``)."""
    return RebalancerService(ctx)
