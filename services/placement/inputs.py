"""What a placement round reads from the store besides the workers: the scheduler's
stage counts per model and the stages its replicas hold for want of a worker.

The waiting stages live in one hash per scheduler replica,
``placement:waiting:{instance}``. The store cannot list keys by pattern, so the
replicas are found where every running replica says it runs: the ``services`` presence
set (:mod:`switchyard.runtime.presence`, members ``{name}:{instance}``). The hash of each
instance heard from within the presence's time to live is read (whatever its service's
name, so any replica that holds stages is counted) and the hashes are summed. A replica
that died takes its hash with it once the hash's own time to live runs out.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

from switchyard.runtime.presence import PRESENCE_TTL_S
from switchyard.state import keys
from switchyard.state.base import StateStore

__all__ = ["parse_counts", "read_demand_counts", "read_waiting", "waiting_instances"]


def parse_counts(fields: Mapping[str, str]) -> dict[str, int]:
    """A hash of model -> decimal count; fields that are not a count >= 0 are left out."""
    counts: dict[str, int] = {}
    for model, text in fields.items():
        try:
            value = int(text)
        except ValueError:
            continue
        if value >= 0:
            counts[model] = value
    return counts


async def read_demand_counts(state: StateStore) -> dict[str, int]:
    """``placement:demand``: stages routed so far, by model."""
    return parse_counts(await state.hgetall(keys.PLACEMENT_DEMAND))


async def waiting_instances(state: StateStore, now_s: float) -> list[str]:
    """The instance ids of the replicas present at ``now_s`` (wall seconds), once each."""
    members = await state.zrange_by_score(keys.SERVICES, now_s - PRESENCE_TTL_S, math.inf)
    instances = (member.partition(":")[2] for member, _ in members)
    return sorted({instance for instance in instances if instance})


async def read_waiting(state: StateStore, now_s: float) -> dict[str, int]:
    """Stages held for want of a worker, by model, summed over every present replica."""
    instances = await waiting_instances(state, now_s)
    hashes = await asyncio.gather(
        *(state.hgetall(keys.placement_waiting(instance)) for instance in instances)
    )
    total: dict[str, int] = {}
    for fields in hashes:
        for model, count in parse_counts(fields).items():
            total[model] = total.get(model, 0) + count
    return total
