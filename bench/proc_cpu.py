"""CPU seconds of processes, read from ``/proc``: what each part of the stack costs.

Wall-clock throughput on a shared two-core machine swings by tens of percent; the CPU a
process spent over a measured window does not depend on what else ran meanwhile, so the
benchmarks divide it by the work done (CPU milliseconds per answered request) and report
that as the headline.

    sampler = CpuSampler({"ingress": 1234, "kafka": broker_pid})
    before = sampler.sample()
    ...  # the measured window
    spent_s = sampler.since(before)   # {"ingress": 1.52, "kafka": 0.81}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` and its reaped children so far
    (None when it is gone). Threads are included: ``/proc/{pid}/stat`` sums them."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICKS_PER_S


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (IPv4 or IPv6), or None."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(inode)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(entry.name)
        except OSError:
            continue
    return None


class CpuSampler:
    """CPU seconds of named processes at a moment, and the difference between two moments.

    Args:
        pids: process name -> pid.
    """

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)

    def sample(self) -> dict[str, float]:
        """CPU seconds of each process now (a process that is gone is left out)."""
        seconds = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return {name: value for name, value in seconds.items() if value is not None}

    def since(self, before: Mapping[str, float]) -> dict[str, float]:
        """CPU seconds each process spent since ``before`` (a :meth:`sample`)."""
        now = self.sample()
        return {name: now[name] - before[name] for name in before if name in now}
