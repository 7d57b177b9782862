"""The scheduler service: joins requests with predictions and estimates, and assigns them."""

from services.scheduler.service import SchedulerService, create

__all__ = ["SchedulerService", "create"]
