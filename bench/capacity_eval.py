"""Capacity of every LLM policy: the highest offered rate at which 90 % and 99 % of the
requests meet every objective (TTFT, TPOT and end to end; :mod:`switchyard.slo`), and
the most goodput, on the Azure conversation and code traces and the Mooncake trace, at
8, 16 and 32 A100/llama-2-7b workers, and on a mixed A100 + L40S cluster of 16.

Each search (:func:`research.llm.capacity_run.run_capacity`) doubles the load from the
trace's own rate until the 90 % target fails, then bisects to 2 %; one seed per probe.
Each trace is cut to its first ``--requests`` rows (default 4,000), so that the
capacity, not the length of the replay, sets the figures. The Mooncake trace's prompts
average 15,000 tokens, whose prefill alone takes about a second and a half on an idle
A100 with this profile, beyond the default 1 s TTFT objective; its TTFT objective here
is 5 s (:data:`TTFT_OBJECTIVE_S`).

The table names, per trace and cluster, the best baseline (every policy but
``switchyard*``, ``gaps*`` and the clairvoyant oracle) and each other policy's capacity
relative to it.

``--with-admission ttft-feasible`` runs every baseline a second time with Switchyard's
admission (listed as ``llm-d + ttft-feasible``; never the best baseline), so the tables
tell what refusing hopeless requests buys apart from what a policy's routing does.

``--chunked-prefill off,512,2048`` runs every search once per setting: ``off`` as
before, a number with chunked prefill at that token budget per iteration
(:mod:`research.llm.chunked`); each setting gets tables of its own. ``--traces`` picks
the traces (default all three; the mixed cluster comes with ``azure-conv``).

``--prefill-workers off,4`` likewise runs every search once per disaggregation setting:
``off`` as before, a number with that many workers of each cluster prefilling and the
rest decoding (:mod:`research.llm.disaggregation`), every policy placing each phase over
its pool; a setting that would leave a pool of some cluster empty is refused.

Run ``make bench-capacity`` or ``python -m bench.capacity_eval [--quick] [--json OUT]``;
the Markdown tables go to stdout. ``--quick``: 1,000 requests, 8 workers, the Azure
conversation trace only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from switchyard.perf import performance_model
from switchyard.policies.registry import PolicyOptions, llm_policy_names
from switchyard.slo import token_slos
from switchyard.traces import head, resolve_trace

from research.llm.capacity_run import capacity_cell, held_rps, run_capacity
from research.llm.disaggregation import pool_problem
from research.llm.experiment import ExperimentConfig

A100 = "a100-80gb/llama-2-7b"
L40S = "l40s-48gb/llama-2-7b"
TRACES = ("azure-conv", "azure-code", "mooncake")
TTFT_OBJECTIVE_S = {"mooncake": 5.0}
"""Traces whose prompts need a TTFT objective other than the default (module docstring)."""
TARGETS = (0.90, 0.99)


@dataclass(frozen=True)
class Search:
    trace: str
    workers: int
    policy: str
    profiles: tuple[str, ...]
    requests: int
    admission: str | None = None
    """Run the policy with this admission instead of its own (``--with-admission``)."""
    chunked_prefill: int | None = None
    """Chunked prefill's token budget per iteration (None: off)."""
    prefill_workers: int | None = None
    """Workers that only prefill, the rest only decode (None: off)."""


def is_baseline(policy: str) -> bool:
    """A policy people would pick instead, as they run it: not Switchyard's own, not
    GAPS, not the oracle, and not a baseline given Switchyard's admission."""
    return (
        not policy.startswith(("switchyard", "gaps"))
        and policy != "oracle"
        and ADMISSION_MARK not in policy
    )


ADMISSION_MARK = " + "
"""Joins a policy's name and the admission it was run with in the tables."""


def _run(search: Search) -> dict[str, Any]:
    trace = head(resolve_trace(search.trace), search.requests)
    config = ExperimentConfig(
        trace=trace.name,
        policies=(search.policy,),
        workers=(search.workers,),
        profiles=search.profiles,
        token_slos=token_slos(ttft_s=TTFT_OBJECTIVE_S.get(search.trace)),
        policy_options=PolicyOptions(admission=search.admission),
        chunked_prefill_tokens=search.chunked_prefill,
        prefill_workers=search.prefill_workers,
    )
    (result,) = run_capacity(config, trace, targets=TARGETS)
    if search.admission is not None:
        result["policy"] += ADMISSION_MARK + search.admission
    return {
        **result,
        "cluster": "+".join(p.split("/")[0] for p in search.profiles),
        "chunked_prefill": search.chunked_prefill,
        "prefill_workers": search.prefill_workers,
    }


def _searches(
    quick: bool,
    requests: int,
    policies: Sequence[str],
    sizes: Sequence[int],
    traces: Sequence[str] = TRACES,
) -> list[Search]:
    if quick:
        return [Search("azure-conv", 8, p, (A100,), min(requests, 1000)) for p in policies]
    searches = [
        Search(trace, workers, policy, (A100,), requests)
        for trace in traces
        for workers in sizes
        for policy in policies
    ]
    if 16 in sizes and "azure-conv" in traces:
        searches += [Search("azure-conv", 16, p, (A100, L40S), requests) for p in policies]
    return searches


def chunked_settings(
    text: str, option: str = "--chunked-prefill", what: str = "token budgets"
) -> list[int | None]:
    """``--chunked-prefill``'s list (or ``option``'s): ``off`` (None) or ``what``, >= 1."""
    settings: list[int | None] = []
    for item in text.split(","):
        item = item.strip()
        if item == "off":
            settings.append(None)
        elif item.isdigit() and int(item) >= 1:
            settings.append(int(item))
        else:
            raise ValueError(f"{option} takes off or {what} >= 1, got {item!r}")
    return settings


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """One table per trace, cluster and chunked-prefill setting: capacity at each
    target, most goodput, and the ratio to the best baseline at 90 %."""
    out: list[str] = []

    def scenario(r: dict[str, Any]) -> tuple[Any, ...]:
        return (
            r["trace"],
            r["workers"],
            r["cluster"],
            r.get("chunked_prefill"),
            r.get("prefill_workers"),
        )

    for key in dict.fromkeys(scenario(r) for r in results):
        trace, workers, cluster, chunked, prefill = key
        rows = [r for r in results if scenario(r) == key]
        baselines = [r for r in rows if is_baseline(r["policy"])]
        best = max(baselines, key=lambda r: held_rps(r, 0), default=None)
        best_rps = held_rps(best, 0) if best is not None else 0.0
        setting = "" if chunked is None else f", chunked prefill {chunked} tokens"
        if prefill is not None:
            setting += f", {prefill} prefill + {workers - prefill} decode workers"
        out.append(f"**{trace}, {workers} workers ({cluster}){setting}**")
        out.append("")
        out.append(
            "| policy | req/s at 90 % | req/s at 99 % | most goodput, req/s | "
            "vs best baseline at 90 % |"
        )
        out.append("|---|---:|---:|---:|---:|")
        for r in sorted(rows, key=lambda r: -held_rps(r, 0)):
            ratio = held_rps(r, 0) / best_rps if best_rps > 0 else float("nan")
            name = r["policy"] + (" (best baseline)" if r is best else "")
            out.append(
                f"| {name} | {capacity_cell(r['targets'][0])} | {capacity_cell(r['targets'][1])} | "
                f"{r['max_goodput']['goodput_rps']:.3g} | {ratio:.2f} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity_eval")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--policies", default=",".join(llm_policy_names()))
    parser.add_argument("--workers", default="8,16,32", help="cluster sizes (default 8,16,32)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--traces", default=",".join(TRACES), help=f"traces (default {','.join(TRACES)})"
    )
    parser.add_argument(
        "--chunked-prefill",
        default="off",
        metavar="LIST",
        help="chunked-prefill settings to search under: off and/or token budgets per "
        "iteration, comma-separated (default off)",
    )
    parser.add_argument(
        "--prefill-workers",
        default="off",
        metavar="LIST",
        help="disaggregation settings to search under: off and/or how many workers of each "
        "cluster only prefill (the rest only decode), comma-separated (default off)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--with-admission",
        metavar="NAME",
        default=None,
        help="also run every baseline with this admission policy (e.g. ttft-feasible), "
        "to tell what a policy's admission buys from what its routing does",
    )
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    sizes = [int(size) for size in args.workers.split(",") if size.strip()]
    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    try:
        settings = chunked_settings(args.chunked_prefill)
        splits = chunked_settings(args.prefill_workers, "--prefill-workers", "worker counts")
    except ValueError as exc:
        parser.error(str(exc))
    searches = _searches(args.quick, args.requests, policies, sizes, traces)
    if args.with_admission is not None:
        PolicyOptions(admission=args.with_admission)  # a bad name fails before any run
        searches += [
            replace(search, admission=args.with_admission)
            for search in searches
            if is_baseline(search.policy)
        ]
    searches = [replace(search, chunked_prefill=c) for c in settings for search in searches]
    searches = [replace(search, prefill_workers=p) for p in splits for search in searches]
    for search in searches:
        if search.prefill_workers is not None:
            problem = pool_problem(search.workers, search.prefill_workers)
            if problem is not None:
                parser.error(f"--{problem}")
    for budget in settings:
        for profile in dict.fromkeys(p for search in searches for p in search.profiles):
            problem = (
                None if budget is None else performance_model(profile).chunk_budget_problem(budget)
            )
            if problem is not None:
                parser.error(f"--chunked-prefill: {problem}")
    if args.processes <= 1:
        results = [_run(search) for search in searches]
    else:
        with mp.get_context("spawn").Pool(args.processes) as pool:
            results = pool.map(_run, searches, chunksize=1)
    print(markdown(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "machine": f"{platform.machine()}, {mp.cpu_count()} CPUs",
            "requests": args.requests,
            "targets": TARGETS,
            "ttft_objective_s": TTFT_OBJECTIVE_S,
            "chunked_prefill": settings,
            "prefill_workers": splits,
            "capacity": results,
        }
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
