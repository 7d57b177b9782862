"""Cutting one process off the network while it lives.

The process runs as a user of its own (``setpriv``); a cut is an iptables rule that
drops every packet that user sends (the ``owner`` match of the OUTPUT chain, which
loopback traffic takes too). Its connections to the broker and to Redis stall as they
would behind a failed switch: nothing is refused or reset, requests simply never arrive,
and they resume when the rule goes. Needs root (``CAP_NET_ADMIN`` and ``CAP_SETUID``),
``iptables`` and ``setpriv``; :func:`unavailable` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def unavailable() -> str | None:
    """Why a cut cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "cutting a process off the network needs root (iptables, setpriv)"
    for tool in ("iptables", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class NetworkCut:
    """Packets of user ``uid`` dropped (:meth:`cut`) or let through (:meth:`restore`).

    Args:
        uid: a user id no other process uses (its processes are the ones cut).
        tag: names the rule (an iptables comment), so a leftover one can be told apart.
    """

    def __init__(self, uid: int, tag: str) -> None:
        self.uid = uid
        self.tag = tag
        self.active = False

    @property
    def argv_prefix(self) -> tuple[str, ...]:
        """Run a command as the cut user (no supplementary groups)."""
        return ("setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--")

    def _rule(self) -> list[str]:
        return [
            "OUTPUT",
            "-m", "owner", "--uid-owner", str(self.uid),
            "-m", "comment", "--comment", self.tag,
            "-j", "DROP",
        ]  # fmt: skip

    def cut(self) -> None:
        subprocess.run(["iptables", "-w", "-I", *self._rule()], check=True, capture_output=True)
        self.active = True

    def restore(self) -> None:
        """Remove the rule (every copy of it; nothing to do when there is none)."""
        while (
            subprocess.run(["iptables", "-w", "-D", *self._rule()], capture_output=True).returncode
            == 0
        ):
            pass
        self.active = False
