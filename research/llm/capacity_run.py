"""``switchyard simulate --capacity``: each policy's capacity on a trace, and its table.

For every cluster size and policy, :func:`~research.llm.capacity.search_capacity`
probes load scales of the trace; a probe runs every seed and averages them. The result
of one search is a JSON-ready ``dict``: the scenario (``policy``, ``reference``,
``workers``, ``trace``, ``gpu``), ``targets`` (per attainment target, the highest load
that held it and the lowest above it that missed, each a probe), ``max_goodput`` (a
probe) and ``probes`` (every load simulated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from switchyard.policies.registry import LlmPolicy, make_llm_policy
from switchyard.traces import Trace, scale_load

from research.llm.capacity import CapacityPoint, search_capacity
from research.llm.experiment import ExperimentConfig, simulate_one

__all__ = ["capacity_cell", "format_capacity_table", "held_rps", "run_capacity"]


def run_capacity(
    config: ExperimentConfig,
    trace: Trace,
    *,
    targets: Sequence[float],
    on_probe: Callable[[str, CapacityPoint], None] | None = None,
    on_search: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One capacity search per cluster size and policy of ``config``; the first of
    ``config.load_scales`` is the first load probed, the first of
    ``config.predictor_errors`` the predictor error."""
    policies = [make_llm_policy(name, config.policy_options) for name in config.policies]
    error = config.predictor_errors[0]
    results: list[dict[str, Any]] = []
    for workers in config.workers:
        for policy in policies:

            def evaluate(
                scale: float, policy: LlmPolicy = policy, workers: int = workers
            ) -> CapacityPoint:
                rows = scale_load(trace, scale).requests
                runs = [
                    simulate_one(
                        config,
                        policy,
                        rows,
                        workers=workers,
                        load_scale=scale,
                        predictor_error=error,
                        seed=seed,
                    )
                    for seed in range(config.seeds)
                ]
                point = CapacityPoint(
                    load_scale=scale,
                    offered_rps=trace.mean_rate_rps * scale,
                    slo_attainment=_mean(runs, "slo_attainment"),
                    goodput_rps=_mean(runs, "goodput_rps"),
                    ttft_p99_s=_mean(runs, "ttft_p99_s"),
                    tpot_p99_s=_mean(runs, "tpot_p99_s"),
                    p99_s=_mean(runs, "p99_s"),
                )
                if on_probe is not None:
                    on_probe(policy.name, point)
                return point

            found = search_capacity(evaluate, targets=targets, start_scale=config.load_scales[0])
            result: dict[str, Any] = {
                "policy": policy.name,
                "reference": policy.reference,
                "workers": workers,
                "trace": config.trace,
                "gpu": ",".join(config.profiles),
                "targets": [
                    {
                        "target": t.target,
                        "held": None if t.held is None else asdict(t.held),
                        "failed": None if t.failed is None else asdict(t.failed),
                    }
                    for t in found.targets
                ],
                "max_goodput": asdict(found.max_goodput),
                "probes": [asdict(p) for p in found.probes],
            }
            results.append(result)
            if on_search is not None:
                on_search(result)
    return results


def _mean(runs: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [float("nan") if run[key] is None else float(run[key]) for run in runs]
    return math.fsum(values) / len(values)


def held_rps(result: Mapping[str, Any], index: int) -> float:
    """The offered rate a search held its ``index``-th target up to (0: none)."""
    held = result["targets"][index]["held"]
    return 0.0 if held is None else float(held["offered_rps"])


def capacity_cell(target: Mapping[str, Any]) -> str:
    """A target's capacity as text: "none" when even the lowest load missed it, a "+"
    when the highest load probed still held it."""
    held, failed = target["held"], target["failed"]
    if held is None:
        return "none"
    text = f"{held['offered_rps']:.3g}"
    return text + ("+" if failed is None else "")


def format_capacity_table(results: Sequence[Mapping[str, Any]]) -> str:
    """The searches as aligned text: per policy, the offered rate (and load scale) each
    target held up to, the most goodput, the probes; under it, per cluster size, the
    policy with the highest capacity at the first target and its lead over the
    runner-up (references, the clairvoyant oracle, never named). A capacity with a
    ``+`` held even at the highest load probed."""
    if not results:
        return ""
    targets = [t["target"] for t in results[0]["targets"]]
    headers = ["policy", "workers"]
    for target in targets:
        headers += [f"req/s @{target:.0%}", f"load @{target:.0%}"]
    headers += ["max goodput/s", "at req/s", "probes"]
    rows: list[list[str]] = []
    for result in results:
        label = f"{result['policy']} (ref)" if result["reference"] else str(result["policy"])
        row = [label, str(result["workers"])]
        for target in result["targets"]:
            held = target["held"]
            row += [capacity_cell(target), "-" if held is None else f"{held['load_scale']:.3g}"]
        best = result["max_goodput"]
        row += [
            f"{best['goodput_rps']:.3g}",
            f"{best['offered_rps']:.3g}",
            str(len(result["probes"])),
        ]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [
        f"capacity on {results[0]['trace']}, gpu {results[0]['gpu']}: the highest offered "
        "rate at which each share of requests met every SLO",
        line(headers),
        "  ".join("-" * w for w in widths),
        *(line(r) for r in rows),
    ]
    for workers in dict.fromkeys(r["workers"] for r in results):
        contenders = sorted(
            (r for r in results if r["workers"] == workers and not r["reference"]),
            key=lambda r: held_rps(r, 0),
            reverse=True,
        )
        if not contenders:
            continue
        best_rps = held_rps(contenders[0], 0)
        text = (
            f"highest capacity at {targets[0]:.0%} ({workers} workers): "
            f"{contenders[0]['policy']} {best_rps:.3g} req/s"
        )
        if len(contenders) > 1:
            runner_rps = held_rps(contenders[1], 0)
            ratio = f"{best_rps / runner_rps:.2f}x" if runner_rps > 0 else "more than"
            text += f", {ratio} the runner-up's ({contenders[1]['policy']}, {runner_rps:.3g})"
        out.append(text)
    return "\n".join(out) + "\n"
