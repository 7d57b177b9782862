"""The progress bar of long runs (``switchyard simulate`` sweeps, ``loadgen replay``).

On a terminal it is a ``rich`` progress bar on one line, redrawn at most ten times a
second::

    simulate ━━━━━━╺━━━━━━━━━━━━━ 12/40 30% eta 0:12 gaps w8 seed 2

Anywhere else (a log file, CI output, a pipe) redrawing would leave a smear of
carriage returns, so it writes whole lines instead, one per tenth of the work or
every ten seconds, whichever comes first, and a last line with the elapsed time::

    simulate 4/40 10% eta 1:30 jsq w4 seed 1
    ...
    simulate 40/40 100% done in 1:41
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


def format_duration(seconds: float) -> str:
    """Seconds as ``m:ss``, or ``h:mm:ss`` from an hour up: 75.4 -> "1:15"."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Shows how far a known amount of work has come; use as a context manager.

    Args:
        total: units of work expected (runs, requests); 0 or less shows 100 % at once.
        label: what is running, first on the line.
        stream: where to write; ``None`` means ``sys.stderr`` at construction, so the
            bar never mixes into results printed on stdout.
        enabled: ``False`` writes nothing; ``True`` always writes; ``None`` writes when
            there is a stream (``sys.stderr`` is ``None`` under ``pythonw`` and some
            embedded interpreters).
        clock: seconds from a monotonic clock; injectable so tests need no sleeps.

    Example:
        >>> with Progress(len(jobs), "simulate") as progress:  # doctest: +SKIP
        ...     for job in jobs:
        ...         progress.set_postfix(job.name)
        ...         run(job)
        ...         progress.advance()
    """

    tty_interval_s = 0.1
    """Shortest time between two redraws on a terminal: faster is flicker, not news."""
    log_interval_s = 10.0
    """Longest silence between two lines off a terminal while work goes on."""
    log_step = 0.1
    """Off a terminal, a line each time this fraction of the work is done."""
    bar_width = 20

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.postfix = ""
        self._stream = sys.stderr if stream is None else stream
        self._enabled = (self._stream is not None) if enabled is None else enabled
        self._clock = clock
        self._start_s = clock()
        self._closed = False
        self._tty = self._enabled and _is_tty(self._stream)
        self._last_draw_s = -float("inf")
        self._last_step = 0
        self._bar: tuple[RichProgress, TaskID] | None = None
        if self._enabled:
            if self._tty:
                self._bar = self._start_bar()
            else:
                self._emit(self._line())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(stopped=exc_type is not None)

    # ------------------------------------------------------------------ public

    def advance(self, n: int = 1, *, postfix: str | None = None) -> None:
        """Count ``n`` more units done and show it if enough time or work has passed.

        ``postfix`` replaces the text at the end of the line in the same step: a caller
        that reports what just finished (``gaps w8 p99 1.23s``) passes it here, because
        a :meth:`set_postfix` right after a redraw waits out the redraw interval.
        """
        self.done += n
        if postfix is not None:
            self.postfix = postfix
        self._maybe_show()

    def set_postfix(self, text: str) -> None:
        """Set the text at the end of the line (what is running now).

        On a terminal the line is redrawn now unless it was redrawn less than
        :attr:`tty_interval_s` ago; elsewhere the text goes out with the next line.
        """
        self.postfix = text
        if self._tty:
            self._maybe_show()

    def close(self, *, stopped: bool = False) -> None:
        """Write the last line with the elapsed time. Calling it again does nothing.

        ``stopped`` (set by the context manager when an exception leaves the block)
        says the work ended early, so the line does not read as a finished run.
        """
        if self._closed:
            return
        self._closed = True
        if not self._enabled:
            return
        elapsed = format_duration(self._clock() - self._start_s)
        tail = f"stopped after {elapsed}" if stopped else f"done in {elapsed}"
        if self._tty:
            self._draw(tail=tail)
            if self._bar is not None:
                try:
                    self._bar[0].stop()
                except (OSError, ValueError):
                    self._enabled = False
        else:
            self._emit(self._line(tail=tail))

    # ------------------------------------------------------------------ drawing

    def _fraction(self) -> float:
        if self.total <= 0:
            return 1.0
        return min(1.0, max(0.0, self.done / self.total))

    def _steps(self) -> int:
        # The bar counts in steps of its own: the count, percent and eta are this
        # class's (a total of 0 or less shows as complete, which rich would not).
        return round(self._fraction() * _BAR_STEPS)

    def _text(self, tail: str | None = None) -> str:
        """What follows the label (and the bar): count, percent, eta or ``tail``, postfix."""
        parts = [f"{self.done}/{self.total}", f"{self._fraction() * 100:.0f}%"]
        parts.append(tail if tail is not None else f"eta {self._eta()}")
        if self.postfix:
            parts.append(self.postfix)
        return " ".join(parts)

    def _line(self, *, tail: str | None = None) -> str:
        """One log line (off a terminal)."""
        return f"{self.label} {self._text(tail)}"

    def _eta(self) -> str:
        elapsed_s = self._clock() - self._start_s
        if self.done <= 0 or elapsed_s <= 0:
            return "?"
        remaining = max(0, self.total - self.done)
        return format_duration(elapsed_s / self.done * remaining)

    def _maybe_show(self) -> None:
        if not self._enabled or self._closed:
            return
        now_s = self._clock()
        if self._tty:
            if now_s - self._last_draw_s >= self.tty_interval_s:
                self._draw()
            return
        # The last step (100 %) is left to close(), which prints the elapsed time.
        step = int(self._fraction() / self.log_step + 1e-9)
        new_step = step > self._last_step and self._fraction() < 1.0
        if new_step or now_s - self._last_draw_s >= self.log_interval_s:
            self._last_step = max(self._last_step, step)
            self._emit(self._line())

    def _start_bar(self) -> tuple[RichProgress, TaskID] | None:
        # Imported here: runs off a terminal (CI, logs, pipes) never pay for rich.
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn
        from rich.progress import Progress as RichProgress

        bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=self.bar_width),
            TextColumn("{task.fields[text]}"),
            # A line wider than the terminal would wrap; rich crops it instead.
            console=Console(file=self._stream, force_terminal=True, soft_wrap=False),
            auto_refresh=False,  # redrawn here, at most every tty_interval_s
            redirect_stdout=False,
            redirect_stderr=False,
            get_time=self._clock,
        )
        try:
            bar.start()
            # Adding the task draws the first line.
            task = bar.add_task(
                self.label, total=_BAR_STEPS, completed=self._steps(), text=self._text()
            )
        except (OSError, ValueError):
            self._enabled = False
            return None
        self._last_draw_s = self._clock()
        return bar, task

    def _draw(self, *, tail: str | None = None) -> None:
        if self._bar is None or not self._enabled:
            return
        bar, task = self._bar
        try:
            bar.update(task, completed=self._steps(), text=self._text(tail))
            bar.refresh()
        except (OSError, ValueError):
            # A closed terminal must not end a run that is still worth finishing.
            self._enabled = False
        self._last_draw_s = self._clock()

    def _emit(self, line: str) -> None:
        self._write(line + "\n")
        self._last_draw_s = self._clock()

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            # A closed pipe or stream must not end a simulation that is still worth
            # finishing; the bar goes quiet instead.
            self._enabled = False


_BAR_STEPS = 1000


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
