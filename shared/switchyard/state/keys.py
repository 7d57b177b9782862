"""Every key Switchyard keeps in the state store, defined once.

Keys are relative to the store's prefix (``SWITCHYARD_STATE_PREFIX``; the store adds
it) and named ``{kind}:{id}[:{detail}]``. Each key has one owning module that writes it;
others only read it, through that module:

=============================  ==========  ===============================================
key                            type        owner (writes) -- readers
=============================  ==========  ===============================================
``request:{id}``               hash        :mod:`switchyard.lifecycle` (every transition of
                                           a request's life) -- ingress, scheduler,
                                           monitor, rebalancer
``worker:{id}``                hash        monitor (heartbeats, liveness); the finish
                                           transition adds ``completed``/``violated``
                                           -- scheduler, ingress, rebalancer
``worker:{id}:assigned``       sorted set  :mod:`switchyard.lifecycle` (assign adds, the
                                           next assign or finish removes) -- monitor,
                                           scheduler (orphans of a dead worker)
``workers``                    sorted set  monitor -- everyone reading the cluster
``monitor:hearing``            hash        monitor (how far it has heard heartbeats)
                                           -- everyone reading the cluster
``cluster:stats``              hash        the finish transition (``completed``,
                                           ``violated``, ``recent``), the dead-letter
                                           tally (``dead_letters``) -- rebalancer,
                                           ``switchyard status``
``predictor:model``            string      predictor (its fitted model, JSON) --
                                           scheduler, rebalancer, a restarted predictor
``estimate:{id}``              string      sneakpeek -- scheduler
``lease:{topic}:{partition}``  string      :mod:`switchyard.state.leases` (partition
                                           leases of addressed topics)
``lease:rebalancer``           string      the rebalancer replica that runs rounds
``lease:placement``            string      the placement replica that runs rounds
``placement:demand``           hash        the scheduler's stage routing (stages per
                                           model, counted) -- placement
``placement:waiting:{inst}``   hash        one scheduler replica's stages with no
                                           worker holding their model -- placement
``claim:worker-down:{id}:..``  string      monitor (one WorkerDown per death)
``state:generation``           string      monitor (written once the answers are restored;
                                           gone = the store lost its data) -- the ledger's
                                           accept (refuses named ids while it is gone)
``services``                   sorted set  :mod:`switchyard.runtime.presence` (each
                                           running service replica) -- ``switchyard
                                           status``
``service:{name}:{instance}``  hash        :mod:`switchyard.runtime.presence` (what a
                                           replica says of itself) -- ``switchyard status``
``tenant:{name}:bucket``       hash        :mod:`services.ingress.quotas` (a tenant's
                                           request-rate token bucket)
``tenant:{name}:calls``        hash        :mod:`services.ingress.quotas` (a tenant's
                                           calls in flight, for its concurrency quota)
=============================  ==========  ===============================================
"""

from __future__ import annotations

WORKERS = "workers"
"""Sorted set: worker id -> when the monitor last heard from it (wall seconds)."""

MONITOR_HEARING = "monitor:hearing"
"""Hash: ``through_s`` (every heartbeat the broker held by then was handled), ``since_s``
(start of the monitor's current stretch of hearing; ``inf`` while it hears nothing) and
``written_s`` (when a liveness check wrote them): see
:class:`switchyard.cluster.records.Hearing`."""

CLUSTER_STATS = "cluster:stats"
"""Hash: ``completed``, ``violated`` (cluster-wide totals), ``recent`` (the outcomes of
the latest completions, oldest first, ``1`` for a missed deadline) and ``superseded``
(answers refused: runs of requests given to another worker meanwhile); ``dead_letters``
(messages no consumer could handle, counted by
:mod:`switchyard.runtime.dead_letter_tally`)."""

SERVICES = "services"
"""Sorted set: ``{name}:{instance}`` of each running service replica -> when it last
said it runs (wall seconds)."""

PREDICTOR_MODEL = "predictor:model"
"""String: the predictor's latest fitted model (``PredictorModel`` JSON)."""

STATE_GENERATION = "state:generation"
"""String, no time to live: a random token the monitor writes once the answers are in
the store; its absence means the store lost its data (or is new) and the answers are not
restored yet (:mod:`services.monitor.state_loss`), so the ledger refuses requests that
name their id meanwhile."""

REBALANCER_LEASE = "lease:rebalancer"
"""String with a time to live: the rebalancer replica that runs rounds."""


PLACEMENT_LEASE = "lease:placement"
"""String with a time to live: the placement replica that runs rounds."""

PLACEMENT_DEMAND = "placement:demand"
"""Hash: model -> stages routed for it so far (decimal text, only ever incremented by
the scheduler's stage routing); the placement service turns it into a rate."""

PLACEMENT_WAITING_TTL_S = 10.0
"""Life of a ``placement:waiting:{instance}`` hash not rewritten (its scheduler gone)."""


def placement_waiting(instance: str) -> str:
    """Hash: model -> stages the scheduler replica ``instance`` holds because no worker
    holds their model (rewritten whole as it changes, with a time to live)."""
    return f"placement:waiting:{instance}"


def service(member: str) -> str:
    """Hash: what the service replica ``member`` (``{name}:{instance}``) says of itself."""
    return f"service:{member}"


def request(request_id: str) -> str:
    """``request:{id}``: one request's record (fields in :mod:`switchyard.lifecycle.record`)."""
    return f"request:{request_id}"


def worker(worker_id: str) -> str:
    """``worker:{id}``: what the monitor knows of one worker."""
    return f"worker:{worker_id}"


def assigned(worker_id: str) -> str:
    """``worker:{id}:assigned``: request id -> assigned-at seconds, every request the
    worker was sent and has not finished (or handed on)."""
    return f"worker:{worker_id}:assigned"


def estimate(request_id: str) -> str:
    """``estimate:{id}``: SneakPeek's AccuracyEstimate of a classification request."""
    return f"estimate:{request_id}"


def lease(topic: str, partition: int) -> str:
    """``lease:{topic}:{partition}``: who reads partition ``partition`` of ``topic``."""
    return f"lease:{topic}:{partition}"


def worker_down_claim(worker_id: str, detail: str) -> str:
    """``claim:worker-down:{id}:{detail}``: taken by the monitor replica that announces
    one death, drain or sweep of a worker (``detail`` names which)."""
    return f"claim:worker-down:{worker_id}:{detail}"


def tenant_bucket(tenant: str) -> str:
    """``tenant:{name}:bucket``: ``tokens`` and ``at_ms``, a tenant's request-rate bucket."""
    return f"tenant:{tenant}:bucket"


def tenant_calls(tenant: str) -> str:
    """``tenant:{name}:calls``: call id -> epoch ms it is held until, a tenant's calls in
    flight on every ingress replica."""
    return f"tenant:{tenant}:calls"
