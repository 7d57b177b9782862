"""The classification figures of docs/benchmarks.md, every table from one run.

1. ``switchyard apps build``: train and profile each application's variants (the
   classification variants table; ``apps show`` prints it).
2. ``switchyard window`` at the defaults, then on the x200 / x50 emulated device with
   the step and the sigmoid penalty (SneakPeek window scheduling tables), three seeds.
3. The deadline sweep (utility against the deadline).
4. ``--regime paper`` with its sigmoid and with the step penalty, and its swap-in
   (``load-scale``) sweep (the paper's regime).
5. ``switchyard estimates`` (the accuracy-estimation table).

Run ``make bench-selection-eval`` or ``python -m bench.selection_eval [--out DIR]``;
JSON of every run goes to DIR (default bench/results/selection).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.cli_runs import run_command

STRESSED = ("--latency-scale", "200", "--load-scale", "50")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/selection"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    run_command(["apps", "build", "--out", str(out / "apps")])
    run_command(["apps", "show", str(out / "apps" / "registry.json")])
    common = ["--registry", str(out / "apps" / "registry.json"), "--seeds", "3", "--windows", "100"]
    run_command(["window", *common, "--json", str(out / "default.json")])
    for penalty in ("step", "sigmoid"):
        run_command(
            ["window", *common, *STRESSED, "--penalty", penalty,
             "--json", str(out / f"{penalty}.json")]
        )  # fmt: skip
    run_command(
        ["window", *common, *STRESSED, "--penalty", "step", "--sweep", "deadline",
         "--json", str(out / "deadline.json"), "--report", str(out / "deadline-report")]
    )  # fmt: skip
    paper = ["window", *common, "--regime", "paper"]
    run_command([*paper, "--json", str(out / "paper.json")])
    run_command([*paper, "--penalty", "step", "--json", str(out / "paper-step.json")])
    run_command(
        [*paper, "--sweep", "load-scale", "--values", "50,75,100,110,125,150,200",
         "--schedulers", "lo-edf,lo-priority,grouped,grouped-da,sneakpeek",
         "--json", str(out / "paper-load.json"), "--report", str(out / "paper-load-report")]
    )  # fmt: skip
    run_command(["estimates", "--registry", str(out / "apps" / "registry.json")])


if __name__ == "__main__":
    main()
