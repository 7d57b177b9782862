"""The loads and unloads this replica ordered that the workers' heartbeats do not show
yet (pure).

A worker takes an order in, then says so in its next heartbeat, which the monitor
records: a round or two may pass in between. Until then the snapshot shows the order
carried out (:class:`~switchyard.cluster.placement_view.PlacedDelta`), as the simulator
carries a plan out at once, so consecutive rounds neither load a model twice nor fill
the room an ordered load will take.

An order is forgotten once a heartbeat shows it (a load: the model listed loading or
ready; an unload: the model listed draining, or not at all) or ``memory_s`` after it was
sent (a worker that refused it, or never got it, shows nothing: the policy decides
again over what the heartbeats say). A later order for the same model on the same worker
replaces an earlier one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from switchyard.cluster.placement_view import PlacedDelta
from switchyard.contracts.messages import Heartbeat, PlacedState

__all__ = ["OrderMemory"]

_HOLDING = frozenset({PlacedState.LOADING, PlacedState.READY})


@dataclass(frozen=True, slots=True)
class _Ordered:
    load: bool
    """True: ordered loaded; False: ordered unloaded."""
    sent_s: float


class OrderMemory:
    """Orders sent, by worker and model, until heartbeats show them.

    Args:
        memory_s: how long an order not shown yet is kept (seconds of the clock passed
            to :meth:`remember` and :meth:`deltas`).
    """

    def __init__(self, memory_s: float) -> None:
        self.memory_s = memory_s
        self._orders: dict[str, dict[str, _Ordered]] = {}

    def __len__(self) -> int:
        return sum(len(models) for models in self._orders.values())

    def remember(
        self, worker_id: str, *, load: Iterable[str], unload: Iterable[str], now_s: float
    ) -> None:
        """Remember one order sent to ``worker_id`` at ``now_s``."""
        models = self._orders.setdefault(worker_id, {})
        for model in unload:
            models[model] = _Ordered(load=False, sent_s=now_s)
        for model in load:
            models[model] = _Ordered(load=True, sent_s=now_s)

    def deltas(self, heartbeats: Mapping[str, Heartbeat], now_s: float) -> dict[str, PlacedDelta]:
        """The orders the latest ``heartbeats`` (by worker id) do not show yet, per worker;
        forgets those they show and those older than ``memory_s``."""
        out: dict[str, PlacedDelta] = {}
        for worker_id in list(self._orders):
            models = self._orders[worker_id]
            beat = heartbeats.get(worker_id)
            listed = {} if beat is None else {p.model: p.state for p in beat.placed}
            for model, order in list(models.items()):
                if now_s - order.sent_s > self.memory_s or (
                    beat is not None and _shown(order, listed.get(model))
                ):
                    del models[model]
            if not models:
                del self._orders[worker_id]
                continue
            if beat is None:
                continue  # not in this round's snapshot: nothing to add to
            out[worker_id] = PlacedDelta(
                loads=frozenset(m for m, o in models.items() if o.load),
                unloads=frozenset(m for m, o in models.items() if not o.load),
            )
        return out


def _shown(order: _Ordered, state: PlacedState | None) -> bool:
    if order.load:
        return state in _HOLDING
    return state is None or state is PlacedState.DRAINING
