"""The multi-model simulator over :mod:`switchyard.multimodel`'s placement policies:
heterogeneous clusters, workloads from the Alibaba traces, metrics, and the
``switchyard multimodel`` command."""
