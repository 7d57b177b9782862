"""The progress bar of long runs, on a terminal and in logs."""

from __future__ import annotations

import io
import re

import pytest
from switchyard.progress import Progress, format_duration


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def tick(self, seconds: float) -> None:
        self.now_s += seconds


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class BrokenPipe(io.StringIO):
    """A stream whose reader went away: every write fails, and is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BAR = re.compile(r" [━╺╸]+ ")


def _redraws(terminal: FakeTerminal) -> list[str]:
    """What each redraw of the line shows, colours and the bar's glyphs left out (every
    redraw begins by going back to the start of the line and erasing it)."""
    frames = [_ESCAPE.sub("", frame) for frame in terminal.getvalue().split("\r")]
    return [_BAR.sub(" ", frame).strip() for frame in frames if frame.strip()]


def test_log_output_is_a_bounded_number_of_lines_and_a_final_one() -> None:
    clock, log = FakeClock(), io.StringIO()
    with Progress(200, "simulate", stream=log, clock=clock) as progress:
        for _ in range(200):
            clock.tick(0.01)
            progress.advance()
    lines = log.getvalue().splitlines()
    # A start line, one per tenth (10 % .. 90 %), and the last line.
    assert len(lines) == 11
    assert lines[0] == "simulate 0/200 0% eta ?"
    assert lines[1].startswith("simulate 20/200 10% eta 0:")
    assert lines[-1] == "simulate 200/200 100% done in 0:02"
    assert "\r" not in log.getvalue()


def test_log_output_speaks_up_after_ten_silent_seconds() -> None:
    clock, log = FakeClock(), io.StringIO()
    with Progress(1000, "replay", stream=log, clock=clock) as progress:
        clock.tick(11)
        progress.advance()
        progress.advance()  # at once: nothing new to say
    lines = log.getvalue().splitlines()
    assert lines == [
        "replay 0/1000 0% eta ?",
        "replay 1/1000 0% eta 3:03:09",
        "replay 2/1000 0% done in 0:11",
    ]


def test_terminal_redraws_at_most_ten_times_a_second() -> None:
    clock, terminal = FakeClock(), FakeTerminal()
    with Progress(1000, "simulate", stream=terminal, clock=clock) as progress:
        for _ in range(1000):
            clock.tick(0.001)  # a second in all
            progress.advance()
    frames = _redraws(terminal)
    # The first draw, about ten more over the second, and the final one (drawn, then
    # left on screen when the bar stops).
    assert 11 <= len(frames) <= 14
    assert terminal.getvalue().count("\n") == 1
    assert frames[0] == "simulate 0/1000 0% eta ?"
    assert frames[-1] == "simulate 1000/1000 100% done in 0:01"


def test_terminal_line_shows_bar_count_percent_eta_and_postfix() -> None:
    clock, terminal = FakeClock(), FakeTerminal()
    with Progress(40, "simulate", stream=terminal, clock=clock) as progress:
        progress.set_postfix("gaps w8 seed 2")
        clock.tick(10)
        progress.advance(12)
        assert _redraws(terminal)[-1] == "simulate 12/40 30% eta 0:23 gaps w8 seed 2"
        # The bar itself: a 20-cell rich bar between the label and the count.
        last = _ESCAPE.sub("", terminal.getvalue().split("\r")[-1])
        assert re.fullmatch(r"simulate [━╺╸]{20} 12/40 .*", last.strip())


def test_each_redraw_erases_the_line_it_replaces() -> None:
    clock, terminal = FakeClock(), FakeTerminal()
    progress = Progress(10, "run", stream=terminal, clock=clock)
    clock.tick(1)
    progress.set_postfix("a long postfix text")
    clock.tick(1)
    progress.set_postfix("")
    redraws = terminal.getvalue().split("\r")[1:]
    assert len(redraws) >= 2
    assert all(frame.startswith("\x1b[2K") for frame in redraws)
    assert _redraws(terminal)[-2:] == ["run 0/10 0% eta ? a long postfix text", "run 0/10 0% eta ?"]
    progress.close()


def test_disabled_writes_nothing() -> None:
    log, terminal = io.StringIO(), FakeTerminal()
    for stream in (log, terminal):
        with Progress(10, "quiet", stream=stream, enabled=False) as progress:
            progress.advance(10)
    assert log.getvalue() == ""
    assert terminal.getvalue() == ""


def test_an_exception_leaves_a_line_saying_the_work_stopped() -> None:
    clock, log = FakeClock(), io.StringIO()

    def simulate() -> None:
        with Progress(10, "simulate", stream=log, clock=clock) as progress:
            progress.advance(3)
            clock.tick(65)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        simulate()
    assert log.getvalue().splitlines()[-1] == "simulate 3/10 30% stopped after 1:05"


def test_close_is_idempotent_and_zero_total_is_complete() -> None:
    log = io.StringIO()
    progress = Progress(0, "nothing", stream=log, clock=FakeClock())
    progress.close()
    progress.close()
    assert log.getvalue().splitlines() == [
        "nothing 0/0 100% eta ?",
        "nothing 0/0 100% done in 0:00",
    ]


def test_a_broken_stream_quiets_the_bar_instead_of_failing_the_run() -> None:
    stream, clock = BrokenPipe(), FakeClock()
    finished = 0
    with Progress(5, "simulate", stream=stream, clock=clock) as progress:
        for _ in range(5):
            clock.tick(60)  # long enough apart that each step would be drawn
            progress.advance()
            finished += 1
    # The run went on to the end, and the bar stopped writing after its first failure.
    assert finished == 5
    assert stream.writes == 1


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00"), (75.4, "1:15"), (3599, "59:59"), (3723, "1:02:03")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_advance_can_carry_the_postfix_of_what_just_finished() -> None:
    clock, terminal = FakeClock(), FakeTerminal()
    with Progress(3, "simulate", stream=terminal, clock=clock) as progress:
        clock.tick(2)
        progress.advance(postfix="gaps w8 p99 1.23s")
        assert _redraws(terminal)[-1].endswith("1/3 33% eta 0:04 gaps w8 p99 1.23s")
