"""The clock the monitor judges silence by (services/monitor/silence.py)."""

from __future__ import annotations

from switchyard.cluster.records import parse_hearing

from services.monitor.silence import HeardThrough

TIMEOUT_S = 1.5


class Reader:
    """A heartbeat reader's handled-through time, set by the test."""

    def __init__(self) -> None:
        self.through_s: float | None = None

    def __call__(self) -> float | None:
        return self.through_s


def attached() -> tuple[HeardThrough, Reader]:
    heard = HeardThrough(gap_s=1.0)
    heard.expect_reader()
    reader = Reader()
    heard.attach(reader)
    return heard, reader


def test_without_a_reader_the_wall_clock_judges() -> None:
    heard = HeardThrough(gap_s=1.0)
    assert heard.judged_at(100.0) == 100.0
    assert heard.silence_s(100.0, 98.0) == 2.0
    # And readers of what it writes judge by the same clock.
    hearing = parse_hearing(heard.record(100.0))
    assert hearing is not None
    assert hearing.silence_s(98.0, 100.1) == 2.0


def test_a_started_monitor_judges_nobody_before_its_reader_has_caught_up() -> None:
    heard = HeardThrough(gap_s=1.0)
    heard.expect_reader()
    assert heard.judged_at(100.0) is None  # no reader yet
    reader = Reader()
    heard.attach(reader)
    assert heard.judged_at(100.0) is None  # reader not caught up yet
    reader.through_s = 100.0
    assert heard.judged_at(100.2) == 100.0
    # A worker last heard long before the monitor started gets a whole timeout from now.
    assert heard.silence_s(100.0, 50.0) == 0.0
    reader.through_s = 101.6
    assert heard.silence_s(heard.judged_at(101.7) or 0.0, 50.0) > TIMEOUT_S


def test_an_outage_stops_the_clock_and_restarts_the_stretch() -> None:
    heard, reader = attached()
    reader.through_s = 100.0
    assert heard.judged_at(100.1) == 100.0
    seen_s = 100.0  # every worker's last heartbeat before the broker went away
    # The broker is gone: the reader's time stands still; past the gap nothing is judged.
    assert heard.judged_at(100.9) == 100.0
    assert heard.judged_at(101.2) is None
    assert heard.judged_at(115.0) is None
    assert not heard.current
    # Back: the workers' heartbeats are still on their way; none is silent yet.
    reader.through_s = 115.1
    judged = heard.judged_at(115.2)
    assert judged == 115.1
    assert heard.silence_s(judged, seen_s) == 0.0
    # A worker that stays silent for a whole timeout after the broker came back is.
    reader.through_s = 116.7
    judged = heard.judged_at(116.8)
    assert judged is not None
    assert heard.silence_s(judged, seen_s) > TIMEOUT_S
    # One that was heard after the return is judged from its heartbeat.
    assert heard.silence_s(judged, 116.0) == judged - 116.0


def test_a_new_reader_begins_a_new_stretch() -> None:
    heard, reader = attached()
    reader.through_s = 100.0
    heard.judged_at(100.0)
    reader.through_s = 110.0
    assert heard.silence_s(heard.judged_at(110.0) or 0.0, 100.5) > TIMEOUT_S
    again = Reader()
    again.through_s = 110.0
    heard.attach(again)  # the heartbeat routine restarted
    judged = heard.judged_at(110.1)
    assert judged is not None
    assert heard.silence_s(judged, 100.5) == 0.0


def test_readers_of_the_written_record_measure_silence_as_the_monitor_does() -> None:
    heard, reader = attached()
    seen_s = 100.0
    readings = []
    # Hearing, then an outage (the reader's time stands still), then back.
    for now_s, through_s in (
        (100.1, 100.0),
        (101.5, 100.0),
        (110.0, 100.0),
        (110.2, 110.1),
        (111.8, 111.7),
    ):
        reader.through_s = through_s
        judged = heard.judged_at(now_s)
        hearing = parse_hearing(heard.record(now_s))
        assert hearing is not None
        monitor_s = 0.0 if judged is None else max(0.0, heard.silence_s(judged, seen_s))
        readings.append((hearing.silence_s(seen_s, now_s + 0.05), monitor_s))
    assert [round(read, 6) for read, _ in readings] == [round(m, 6) for _, m in readings]
    # Through the outage nobody is silent; a whole timeout after it, the worker is.
    assert readings[2][0] == 0.0
    assert readings[4][0] > TIMEOUT_S
