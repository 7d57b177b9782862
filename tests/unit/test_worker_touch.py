"""When a worker must check what it holds against the ledger before running more of it
(:class:`services.worker.touch.Touch`): after it was out of touch for the worker
timeout, or after a silence that long between two heartbeats."""

from __future__ import annotations

from services.worker.touch import Touch


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_heartbeats_within_the_timeout_keep_the_worker_in_touch() -> None:
    clock = Clock()
    touch = Touch(2.0, clock)
    for _ in range(10):
        clock.now_s += 0.5
        touch.heard()
        assert not touch.needs_check()


def test_a_silence_longer_than_the_timeout_needs_a_check_until_one_is_made() -> None:
    clock = Clock()
    touch = Touch(2.0, clock)
    clock.now_s += 2.5  # no heartbeat got through: the monitor may have declared it down
    assert touch.needs_check()
    touch.checked()
    assert not touch.needs_check()


def test_a_stop_the_process_did_not_see_needs_a_check_even_once_heard_again() -> None:
    # Frozen for 5 s: when it wakes, its next heartbeat may get through before the engine
    # looks, but the gap stays on record until the holdings were checked.
    clock = Clock()
    touch = Touch(2.0, clock)
    clock.now_s += 5.0
    touch.heard()
    assert touch.needs_check()
    clock.now_s += 0.5
    touch.heard()
    assert touch.needs_check()
    touch.checked()
    assert not touch.needs_check()
