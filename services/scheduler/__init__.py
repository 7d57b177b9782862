"""The scheduler service: joins requests with predictions and estimates, and assigns them."""

from services.scheduler.service import (
    SchedulerService,
    assigned_set_key,
    assignment_key,
    create,
    request_key,
)

__all__ = ["SchedulerService", "assigned_set_key", "assignment_key", "create", "request_key"]
