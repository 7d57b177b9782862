"""deploy/local/docker.sh starts the engine even when its pid file names another program.

A session's processes end before the next run, so the pid file it leaves behind is stale,
and the kernel may by then have given that number to an unrelated process. The script
must not wait on that process as if it were a starting dockerd.

The engine here is a stand-in: a `docker` that answers `info` once a `dockerd` has run,
a `dockerd` that marks that it ran and then sleeps, and an `id` that says root (only root
may start dockerd), so the test runs for any user.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local" / "docker.sh"

FAKE_DOCKER = """#!/bin/sh
case "$1" in
  info) [ -f "$FAKE_MARK" ] || exit 1; [ "$2" = --format ] && echo overlay2; exit 0 ;;
  version) echo fake; exit 0 ;;
esac
exit 1
"""

FAKE_ID = """#!/bin/sh
[ "$1" = -u ] && echo 0 && exit 0
exec /usr/bin/id "$@"
"""

FAKE_DOCKERD = """#!/bin/sh
touch "$FAKE_MARK"
sleep 60
"""


def _tool(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)


def test_a_pid_file_naming_another_live_program_starts_a_fresh_dockerd(
    tmp_path: Path,
) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    _tool(tools, "docker", FAKE_DOCKER)
    _tool(tools, "dockerd", FAKE_DOCKERD)
    _tool(tools, "id", FAKE_ID)
    cache = tmp_path / "cache"
    (cache / "docker").mkdir(parents=True)
    pidfile = cache / "docker" / "dockerd.pid"
    bystander = subprocess.Popen(["sleep", "60"])
    pidfile.write_text(f"{bystander.pid}\n")
    env = {
        **os.environ,
        "PATH": f"{tools}:{os.environ['PATH']}",
        "SWITCHYARD_CACHE_DIR": str(cache),
        "FAKE_MARK": str(tmp_path / "dockerd-ran"),
    }
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), "engine"],
            env=env,
            capture_output=True,
            text=True,
            timeout=45,
        )
        assert done.returncode == 0, done.stderr
        assert "starting dockerd" in done.stderr
        assert "waiting for it" not in done.stderr, "it waited on an unrelated program"
        assert bystander.poll() is None, "the unrelated program was left alone"
        started = int(pidfile.read_text())
        assert started != bystander.pid
        assert Path(f"/proc/{started}/comm").read_text().strip() == "dockerd"
    finally:
        bystander.kill()
        bystander.wait()
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
