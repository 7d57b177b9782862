"""What the services read back from the shared store: the workers as the monitor recorded
them (and the policies' views of them), and the model the predictor published."""

from switchyard.cluster.records import (
    ClusterReader,
    ClusterView,
    WorkerRecord,
    WorkerStatus,
    is_alive,
    parse_worker_record,
    read_assigned,
    read_cluster,
    worker_profile,
)
from switchyard.cluster.views import (
    ProfileConstants,
    cluster_snapshot,
    profile_constants,
    worker_view,
)

__all__ = [
    "ClusterReader",
    "ClusterView",
    "ProfileConstants",
    "WorkerRecord",
    "WorkerStatus",
    "cluster_snapshot",
    "is_alive",
    "parse_worker_record",
    "profile_constants",
    "read_assigned",
    "read_cluster",
    "worker_profile",
    "worker_view",
]
