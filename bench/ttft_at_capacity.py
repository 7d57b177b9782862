"""P99 time to first token at the best baseline's capacity: Switchyard against that
baseline at the very same load.

Reads a capacity run's JSON (``make bench-capacity`` writes
``bench/results/capacity_eval.json``): for every trace and cluster without chunked
prefill or disaggregation, the best baseline at 90 % attainment (:func:`is_baseline`)
and the load it held. Then simulates ``switchyard`` and that baseline at that load (the
same trace head, profiles and objectives as the capacity run, ``--seeds`` seeds) and
prints the P99 TTFT of each and their ratio (issue 17's target: at most 0.8), and the
share of requests each meets every objective for there (a capacity found by bisection
is exact to its 2 % step only; at one load the two compare directly). TTFT is
over the requests served: a request Switchyard's admission refused has none (it counts
as a miss in every capacity figure). Beside them, a floor no policy goes under without
refusing requests: the P99 over the trace of each prompt's prefill alone on an idle
worker of the fastest profile (its first token can come no sooner).

Run ``python -m bench.ttft_at_capacity [--capacity-json PATH] [--seeds N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from switchyard.perf import performance_model
from switchyard.policies.registry import make_llm_policy
from switchyard.slo import token_slos
from switchyard.stats import quantile
from switchyard.traces import TraceRequest, head, resolve_trace, scale_load

from bench.capacity_eval import TTFT_OBJECTIVE_S, is_baseline
from research.llm.experiment import ExperimentConfig, simulate_one

CAPACITY_JSON = Path(__file__).parent / "results" / "capacity_eval.json"


def best_baselines(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Per trace and cluster (plain engine), the search of the baseline that held the
    highest rate at the first target."""
    best: dict[tuple[str, int, str], dict[str, Any]] = {}
    for search in document["capacity"]:
        if search.get("chunked_prefill") or search.get("prefill_workers"):
            continue
        held = search["targets"][0]["held"]
        if not is_baseline(search["policy"]) or held is None:
            continue
        key = (search["trace"], search["workers"], search["gpu"])
        if key not in best or held["offered_rps"] > best[key]["targets"][0]["held"]["offered_rps"]:
            best[key] = search
    return [best[key] for key in sorted(best)]


def _at_capacity(
    policy: str, search: dict[str, Any], rows: Sequence[Any], seeds: int, config: ExperimentConfig
) -> tuple[float, float]:
    """``policy``'s P99 TTFT and SLO attainment at the load ``search`` held (medians over
    ``seeds``)."""
    scale = search["targets"][0]["held"]["load_scale"]
    runs = [
        simulate_one(
            config,
            make_llm_policy(policy),
            rows,
            workers=search["workers"],
            load_scale=scale,
            predictor_error=0.0,
            seed=seed,
        )
        for seed in range(seeds)
    ]
    return (
        statistics.median(run["ttft_p99_s"] for run in runs),
        statistics.median(run["slo_attainment"] for run in runs),
    )


def idle_prefill_p99_s(rows: Sequence[TraceRequest], profiles: Sequence[str]) -> float:
    """The P99 over ``rows`` of each prompt's prefill alone on the fastest idle profile."""
    models = [performance_model(profile) for profile in dict.fromkeys(profiles)]
    return quantile([min(m.prefill_s((r.prompt_tokens,)) for m in models) for r in rows], 0.99)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity-json", type=Path, default=CAPACITY_JSON)
    parser.add_argument("--seeds", type=int, default=1, help="median over seeds (default 1)")
    args = parser.parse_args(argv)
    if not args.capacity_json.exists():
        raise SystemExit(f"{args.capacity_json}: not found; run `make bench-capacity` first")
    document = json.loads(args.capacity_json.read_text())
    requests = document["requests"]
    print(
        "| trace, cluster | best baseline | its capacity, req/s | its P99 TTFT s | "
        "switchyard's P99 TTFT s | ratio | floor: P99 idle prefill s | "
        "its SLO attainment | switchyard's |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for search in best_baselines(document):
        trace_name = search["trace"].split("[")[0]
        trace = head(resolve_trace(trace_name), requests)
        profiles = tuple(search["gpu"].split(","))
        config = ExperimentConfig(
            trace=trace.name,
            policies=(search["policy"],),
            workers=(search["workers"],),
            profiles=profiles,
            token_slos=token_slos(ttft_s=TTFT_OBJECTIVE_S.get(trace_name)),
        )
        rows = scale_load(trace, search["targets"][0]["held"]["load_scale"]).requests
        base, base_met = _at_capacity(search["policy"], search, rows, args.seeds, config)
        ours, ours_met = _at_capacity("switchyard", search, rows, args.seeds, config)
        cluster = f"{search['workers']} workers {search['cluster']}"
        print(
            f"| {trace_name}, {cluster} | {search['policy']} | "
            f"{search['targets'][0]['held']['offered_rps']:.3g} | {base:.3f} | {ours:.3f} | "
            f"{ours / base:.2f} | {idle_prefill_p99_s(trace.requests, profiles):.3f} | "
            f"{base_met:.1%} | {ours_met:.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
