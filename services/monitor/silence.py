"""The clock a worker's silence is judged by: how far the monitor has heard.

A worker is dead when it was silent while the monitor could hear it. The wall clock
alone cannot tell the two apart: during a broker outage, a monitor restart or a consumer
that has not read its backlog yet, every worker looks silent. So silence is measured up
to :meth:`HeardThrough.judged_at`, the time by which the monitor had handled every
heartbeat the broker held (:meth:`switchyard.bus.Subscription.handled_through_s`), and
only from the start of the current stretch of hearing:

- that time stands still while the broker is unreachable, so nobody's silence grows;
- when it has not moved for ``gap_s`` (an outage, a stall), nothing is judged, and once it
  moves again the stretch begins anew: each worker then gets a whole timeout to be heard
  before it can be declared down (its heartbeats sent during the outage are still on their
  way, and the monitor's backlog is still being read);
- a monitor that has just started judges nobody until its reader has caught up, and then
  waits a whole timeout too.

Without a reader attached (a monitor whose routines do not run, in tests) the wall clock
is the judge, as before.

Each liveness check also writes this clock to ``monitor:hearing``
(:meth:`HeardThrough.record`), and everyone who reads the cluster measures a worker's
silence by it (:class:`switchyard.cluster.records.Hearing`): admission and placement then
do not take live workers for gone when the monitor could not hear them either.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

log = logging.getLogger("switchyard.monitor")


class HeardThrough:
    """How far the monitor has heard, and since when without a gap (module docstring).

    Args:
        gap_s: how long the heard-through time may stand still before the stretch of
            hearing counts as broken.
    """

    def __init__(self, *, gap_s: float) -> None:
        self.gap_s = gap_s
        self._read: Callable[[], float | None] | None = None
        self._expect_reader = False
        self.since_s: float = -math.inf
        """Start of the current stretch of hearing (``-inf`` when judged by the clock)."""
        self.current = True
        """Whether the last judgement found the monitor hearing."""
        self.through_s: float | None = None
        """The heard-through time of the last judgement (None before any)."""

    def expect_reader(self) -> None:
        """From now on judge by a reader only: none yet means nobody is judged."""
        self._expect_reader = True
        self.since_s = math.inf

    def attach(self, read: Callable[[], float | None]) -> None:
        """Judge by ``read`` (the heartbeat subscription's handled-through time); a new
        reader (the routine restarted) begins a new stretch."""
        self._read = read
        self._expect_reader = True
        self.since_s = math.inf

    def judged_at(self, now_s: float) -> float | None:
        """The time up to which silence can be judged now; None: judge nobody."""
        if self._read is None:
            if self._expect_reader:
                return None
            self.through_s = now_s
            return now_s
        through_s = self._read()
        if through_s is not None:
            self.through_s = through_s
        if through_s is None or now_s - through_s > self.gap_s:
            if self.current:
                log.warning(
                    "heartbeats are not being heard (broker unreachable, or the reader "
                    "behind): no worker is declared down until they are",
                    extra={"event": "heartbeats-not-heard"},
                )
            self.current = False
            self.since_s = math.inf
            return None
        if not self.current or self.since_s == math.inf:
            if not self.current:
                log.info(
                    "heartbeats are heard again: workers are judged from now on",
                    extra={"event": "heartbeats-heard"},
                )
            self.current = True
            self.since_s = through_s
        return through_s

    def record(self, now_s: float) -> dict[str, str]:
        """The fields of ``monitor:hearing`` after the judgement at ``now_s``: a stretch
        that is not hearing now has ``since_s`` infinite (nobody's silence grows)."""
        hearing = self.current and self.through_s is not None and self.since_s != math.inf
        return {
            "through_s": repr(self.through_s or 0.0),
            "since_s": repr(self.since_s if hearing else math.inf),
            "written_s": repr(now_s),
        }

    def silence_s(self, judged_s: float, last_seen_s: float) -> float:
        """How long a worker last heard from at ``last_seen_s`` has been silent while the
        monitor was hearing, as of ``judged_s``."""
        return judged_s - max(last_seen_s, self.since_s)
