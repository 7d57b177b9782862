"""Machine instructions per unit of work (the interpreter's and any compiled module's),
counted by valgrind: a figure that does not move with the machine, where wall-clock runs
on a shared 2-core machine spread by tens of percent.

Two workloads, each run under ``valgrind --tool=callgrind`` twice, with one pass and
with more; the difference, divided by the work of the extra passes, leaves out
start-up, imports and warm-up:

- ``simulator``: ``Simulator.run`` over the whole Azure conversation trace on 8
  A100 workers (``--policy``, ``--load-scale``); per simulated request, and whether the
  compiled simulator ran (:mod:`switchyard.native`; ``SWITCHYARD_NATIVE=0`` counts the
  pure-Python one).
- ``window``: ``bench.selection_bench``'s 200 synthetic windows (24 requests, 5
  applications), each planned by ``--scheduler`` with the collector paused as the
  scheduler service plans; per plan, and whether the window search ran compiled.

``--tree PATH`` counts another checkout of Switchyard (a ``git worktree`` of an older
commit), so two versions are compared in one sitting.

Run ``python -m bench.instruction_count simulator|window [--tree PATH]``. Needs
valgrind (Debian's package). Figures are not asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_SIMULATOR = """
import sys
import research.llm
from switchyard.policies import make_llm_policy
from switchyard.traces import resolve_trace, scale_load
from research.llm import SimulationConfig, Simulator
rows = scale_load(resolve_trace("azure-conv"), float(sys.argv[2])).requests
for _ in range(int(sys.argv[3])):
    Simulator(make_llm_policy(sys.argv[1]), SimulationConfig(workers=8, seed=0)).run(rows)
print("compiled" if getattr(research.llm, "NATIVE", False) else "pure", len(rows))
"""

_WINDOW = """
import random, sys
import numpy as np
from bench.selection_bench import synthetic_apps, synthetic_window
from switchyard.heap import collector_paused, settle_heap
from switchyard.policies.base import DecisionContext
from switchyard.selection.registry import make_window_scheduler
rng = np.random.default_rng(0)
apps = synthetic_apps(5, rng)
windows = [synthetic_window(apps, 24, 0.1 * (i + 1), rng) for i in range(200)]
scheduler = make_window_scheduler(sys.argv[1])
settle_heap()
for _ in range(int(sys.argv[3])):
    for i, window in enumerate(windows):
        with collector_paused():
            scheduler.schedule(window, DecisionContext(random.Random(i), sequence=i))
try:
    from switchyard.native import compiled
    from switchyard.selection import grouped
    build = "compiled" if compiled(grouped) else "pure"
except ImportError:  # a tree from before the window search could be compiled
    build = "pure"
print(build, len(windows))
"""

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def count(tree: Path, code: str, args: list[str], passes: int) -> tuple[int, int, str]:
    """Instructions of one run of ``code`` with ``passes`` passes, its units a pass, and
    what else it printed (which build ran)."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'shared'}{os.pathsep}{tree}"}
    run = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            code,
            *args,
            str(passes),
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = _COLLECTED.search(run.stderr)
    if found is None:
        raise SystemExit(f"instruction_count: valgrind reported no count:\n{run.stderr[-2000:]}")
    *said, units = run.stdout.split()
    return int(found.group(1)), int(units), " ".join(said)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instruction_count")
    parser.add_argument("workload", choices=("simulator", "window"))
    parser.add_argument("--policy", default="gaps", help="simulator: LLM policy (default gaps)")
    parser.add_argument("--load-scale", type=float, default=1.0, help="simulator (default 1)")
    parser.add_argument("--scheduler", default="sneakpeek", help="window (default sneakpeek)")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("instruction_count: valgrind not found (Debian package valgrind)")
    if args.workload == "simulator":
        code, inner, extra, unit = _SIMULATOR, [args.policy, str(args.load_scale)], 1, "request"
    else:
        code, inner, extra, unit = _WINDOW, [args.scheduler, "0"], 2, "plan"
    tree = args.tree.resolve()
    once, units, said = count(tree, code, inner, 1)
    more, _, _ = count(tree, code, inner, 1 + extra)
    what = inner[0] if args.workload == "window" else f"{inner[0]} at load {inner[1]}"
    print(
        f"{args.workload} {what}, {said} ({tree}): "
        f"{(more - once) / (extra * units):,.0f} instructions a {unit}"
    )


if __name__ == "__main__":
    main()
