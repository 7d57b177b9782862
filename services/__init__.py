"""Switchyard's services, one subpackage each: ingress, monitor, predictor, estimator,
scheduler, rebalancer and worker.

Each is a thin asyncio shell built on :mod:`switchyard.runtime`: it consumes its topics,
builds a frozen snapshot, calls a policy from the shared library, and publishes the
decision. No service holds state that another needs: that lives in Kafka and Redis.
"""
