"""The monitor service: worker liveness (heartbeats, WorkerDown).

Run it with ``python -m services.monitor``; see :mod:`services.monitor.service`.
"""

from __future__ import annotations

from switchyard.runtime.service import Service, ServiceContext

from services.monitor.service import MonitorService

__all__ = ["MonitorService", "create"]


async def create(ctx: ServiceContext) -> Service:
    """The monitor for ``ctx`` (not started: the runtime calls ``start``)."""
    return MonitorService(ctx)
