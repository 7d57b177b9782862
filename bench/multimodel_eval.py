"""The multi-model figures of docs/benchmarks.md, every table from one run.

1. ``switchyard multimodel`` on the synthetic mix, 16 workers, three seeds (the policy
   table), and on the Alibaba LoRA mix (arrivals compressed 50 times, 600 s).
2. The sweeps on the synthetic mix, two seeds each: update frequency, load fluctuation
   intensity, cluster heterogeneity (share of slow workers) and model invocation ratio
   (share of requests that run a multi-stage pipeline).
(The decision-time table comes from ``bench/multimodel_policy_bench.py``.)

Run ``make bench-multimodel`` or ``python -m bench.multimodel_eval [--out DIR]``; JSON
of every run goes to DIR (default bench/results/multimodel).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.cli_runs import run_command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/multimodel"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    synthetic = ["multimodel", "--workload", "synthetic", "--workers", "16"]
    run_command([*synthetic, "--seeds", "3", "--json", str(out / "synthetic.json")])
    run_command(
        ["multimodel", "--workload", "lora", "--workers", "16", "--time-scale", "50",
         "--duration-s", "600", "--seeds", "3", "--json", str(out / "lora.json")]
    )  # fmt: skip
    for sweep in ("update-frequency", "fluctuation", "heterogeneity", "invocation-ratio"):
        stem = sweep.replace("-", "_")
        run_command(
            [*synthetic, "--seeds", "2", "--sweep", sweep,
             "--json", str(out / f"{stem}.json"), "--report", str(out / f"report_{stem}")]
        )  # fmt: skip


if __name__ == "__main__":
    main()
