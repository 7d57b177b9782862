"""The placement service's memory of its own orders (services.placement.orders): shown
in the snapshot until a heartbeat shows them, then forgotten."""

from __future__ import annotations

from switchyard.cluster.placement_view import PlacedDelta
from switchyard.contracts.messages import Heartbeat, PlacedModel, PlacedState

from services.placement.orders import OrderMemory


def beat(worker_id: str, **states: PlacedState) -> Heartbeat:
    return Heartbeat.model_validate(
        {
            "worker_id": worker_id,
            "worker_type": "emulated-models",
            "sequence": 1,
            "interval_s": 0.5,
            "queue_length": 0,
            "queued_work_s": 0.0,
            "running": 0,
            "utilization": 0.0,
            "placed": [PlacedModel(model=m, state=s) for m, s in states.items()],
            "sent_at_s": 0.0,
        }
    )


def test_an_order_is_shown_until_the_heartbeat_shows_it() -> None:
    memory = OrderMemory(memory_s=10.0)
    memory.remember("w1", load=["b"], unload=["a"], now_s=0.0)
    before = {"w1": beat("w1", a=PlacedState.READY)}
    assert memory.deltas(before, 1.0) == {
        "w1": PlacedDelta(loads=frozenset({"b"}), unloads=frozenset({"a"}))
    }
    # The worker drains a and loads b: both shown, both forgotten.
    after = {"w1": beat("w1", a=PlacedState.DRAINING, b=PlacedState.LOADING)}
    assert memory.deltas(after, 2.0) == {}
    assert len(memory) == 0


def test_an_unload_is_shown_once_the_model_is_gone() -> None:
    memory = OrderMemory(memory_s=10.0)
    memory.remember("w1", load=[], unload=["a"], now_s=0.0)
    assert memory.deltas({"w1": beat("w1")}, 1.0) == {}


def test_each_part_is_forgotten_on_its_own() -> None:
    memory = OrderMemory(memory_s=10.0)
    memory.remember("w1", load=["a", "b"], unload=[], now_s=0.0)
    deltas = memory.deltas({"w1": beat("w1", a=PlacedState.READY)}, 1.0)
    assert deltas == {"w1": PlacedDelta(loads=frozenset({"b"}))}


def test_an_order_never_shown_is_forgotten_after_the_memory() -> None:
    """A load the worker refused shows nothing: after a while the policy decides again."""
    memory = OrderMemory(memory_s=3.0)
    memory.remember("w1", load=["a"], unload=[], now_s=0.0)
    assert memory.deltas({"w1": beat("w1")}, 3.0) != {}
    assert memory.deltas({"w1": beat("w1")}, 3.5) == {}
    assert len(memory) == 0


def test_a_draining_model_is_not_a_load_shown() -> None:
    memory = OrderMemory(memory_s=10.0)
    memory.remember("w1", load=["a"], unload=[], now_s=0.0)
    deltas = memory.deltas({"w1": beat("w1", a=PlacedState.DRAINING)}, 1.0)
    assert deltas == {"w1": PlacedDelta(loads=frozenset({"a"}))}


def test_a_later_order_for_a_model_replaces_the_earlier_one() -> None:
    memory = OrderMemory(memory_s=10.0)
    memory.remember("w1", load=["a"], unload=[], now_s=0.0)
    memory.remember("w1", load=[], unload=["a"], now_s=1.0)
    assert memory.deltas({"w1": beat("w1", a=PlacedState.READY)}, 2.0) == {
        "w1": PlacedDelta(unloads=frozenset({"a"}))
    }


def test_a_worker_missing_from_the_round_gets_no_delta_but_its_orders_are_kept() -> None:
    memory = OrderMemory(memory_s=10.0)
    memory.remember("w1", load=["a"], unload=[], now_s=0.0)
    assert memory.deltas({}, 1.0) == {}
    assert memory.deltas({"w1": beat("w1")}, 2.0) == {"w1": PlacedDelta(loads=frozenset({"a"}))}
