"""``switchyard simulate``: compare LLM scheduling policies on a trace, in virtual time.

Prints a table (one row per policy and setting), writes the runs as JSON (``--json``)
and plots with an HTML page (``--report``). Every bad input (trace, policy, profile,
number) ends the command with one line naming it and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchyard.policies.registry import llm_policy_names
from switchyard.slo import token_slos

from research.args import comma_list
from research.llm.disaggregation import pool_problem

if TYPE_CHECKING:  # the heavy modules load only when a command runs
    from switchyard.traces import Trace

    from research.llm.capacity import CapacityPoint
    from research.llm.experiment import ExperimentConfig

EXIT_BAD_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        default="azure-conv-sample",
        help="azure-code, azure-conv (full traces), azure-code-sample, azure-conv-sample, "
        "azure-mix-sample (bundled), poisson:..., bursty:..., diurnal:..., or a CSV path "
        "in the Azure format (default azure-conv-sample)",
    )
    parser.add_argument(
        "--workers", type=comma_list(int, "--workers"), default=(8,),
        help="cluster size, or a comma-separated list to sweep (default 8)",
    )  # fmt: skip
    parser.add_argument(
        "--policies", type=comma_list(str, "--policies"), default=tuple(llm_policy_names()),
        help=f"comma-separated policies (default all: {', '.join(llm_policy_names())})",
    )  # fmt: skip
    parser.add_argument(
        "--gpu", type=comma_list(str, "--gpu"), default=("a100-80gb/llama-2-7b",),
        help="performance profile GPU/MODEL; several (comma-separated) make a mixed cluster, "
        "assigned to workers in turn (default a100-80gb/llama-2-7b)",
    )  # fmt: skip
    parser.add_argument(
        "--load-scale", type=comma_list(float, "--load-scale"), default=(1.0,),
        help="divide inter-arrival times by this (2 = twice the rate); a list sweeps (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--slo-scale", type=float, default=5.0,
        help="SLO: latency at most this times the service time on an idle worker (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--ttft-slo-s", type=float, default=None,
        help="TTFT objective in seconds for every request (default by workload: code 0.5, "
        "conversation and other 1.0; see switchyard.slo)",
    )  # fmt: skip
    parser.add_argument(
        "--tpot-slo-s", type=float, default=None,
        help="TPOT objective in seconds for every request (default 0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--capacity", action="store_true",
        help="search each policy's capacity instead: the highest load at which --targets "
        "of the requests meet every SLO (--load-scale is the first load probed)",
    )  # fmt: skip
    parser.add_argument(
        "--targets", type=comma_list(float, "--targets"), default=(0.90, 0.99),
        help="SLO attainment targets of --capacity, 0..1 (default 0.9,0.99)",
    )  # fmt: skip
    parser.add_argument(
        "--predictor-error", type=comma_list(float, "--predictor-error"), default=(0.0,),
        help="multiplicative error injected into predictions, 0..1 (0.4 = 40 %%); a list sweeps",
    )  # fmt: skip
    parser.add_argument(
        "--predictor", default="linear", help="service-time predictor: linear or mlp"
    )
    parser.add_argument(
        "--admission", default=None, metavar="NAME",
        help="run every policy with this admission policy instead of its own: none, or "
        "ttft-feasible (refuse a request no worker can give its first token in time); "
        "default: each policy's own (only switchyard has one)",
    )  # fmt: skip
    parser.add_argument(
        "--chunked-prefill", type=int, default=None, metavar="TOKENS",
        help="run every worker with chunked prefill (Sarathi-Serve; vLLM's "
        "enable_chunked_prefill) at this token budget per iteration (max_num_batched_tokens, "
        "at least the profile's batch slots, 256): running requests decode one token each "
        "and prompts are prefilled in chunks from the rest; default off (a prompt is "
        "prefilled whole, stalling the batch's decodes)",
    )  # fmt: skip
    parser.add_argument(
        "--prefill-workers", type=int, default=None, metavar="N",
        help="disaggregate prefill and decode (DistServe, Splitwise, Dynamo): the first N "
        "workers only prefill, the rest only decode and get each request's KV cache over "
        "the interconnect; every policy places each phase over its pool; default off "
        "(every worker runs both phases)",
    )  # fmt: skip
    parser.add_argument(
        "--decode-at-arrival", action="store_true",
        help="with --prefill-workers: choose each request's decode worker on arrival, with "
        "its prefill worker (Splitwise, llm-d and the live stack do), not when its prefill "
        "ends",
    )  # fmt: skip
    parser.add_argument(
        "--heartbeat-s", type=float, default=None, metavar="S",
        help="policies decide on each worker as its last heartbeat (every S seconds) showed "
        "it, plus the requests sent to it since, as the live stack's placer does; default "
        "off (they see every worker's state at that instant)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=1, help="seeds per setting (default 1)")
    parser.add_argument("--requests", type=int, default=None, help="use the first N requests")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write runs here")
    parser.add_argument(
        "--report", type=Path, default=None, metavar="DIR", help="write plots and index.html"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_numbers(args: argparse.Namespace) -> None:
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests must be at least 1, got {args.requests}")
    for scale in args.load_scale:
        if scale <= 0:
            raise ValueError(f"--load-scale must be > 0, got {scale:g}")
    for workers in args.workers:
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
    if args.decode_at_arrival and args.prefill_workers is None:
        raise ValueError("--decode-at-arrival needs --prefill-workers")
    beat = args.heartbeat_s
    if beat is not None and not (math.isfinite(beat) and beat > 0):
        raise ValueError(f"--heartbeat-s must be a positive number of seconds, got {beat:g}")
    if args.prefill_workers is not None:
        for workers in args.workers:
            problem = pool_problem(workers, args.prefill_workers)
            if problem is not None:
                raise ValueError(f"--{problem}")
    for error in args.predictor_error:
        if not 0.0 <= error <= 1.0:
            raise ValueError(f"--predictor-error must be within [0, 1], got {error:g}")
    for name in ("ttft_slo_s", "tpot_slo_s"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value:g}")
    if args.capacity:
        for target in args.targets:
            if not 0.0 < target <= 1.0:
                raise ValueError(f"--targets must be within (0, 1], got {target:g}")
        if len(args.load_scale) > 1 or len(args.predictor_error) > 1:
            raise ValueError(
                "--capacity searches the load itself: give one --load-scale (the first "
                "load probed) and one --predictor-error"
            )


def run(args: argparse.Namespace) -> int:
    """The command's body; returns the exit status."""
    try:
        return _run(args)
    except (ValueError, OSError) as exc:
        print(f"switchyard simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run(args: argparse.Namespace) -> int:
    from switchyard.perf import performance_model
    from switchyard.policies import PolicyOptions, make_llm_policy
    from switchyard.prediction import make_predictor
    from switchyard.progress import Progress
    from switchyard.traces import head, resolve_trace, scale_load

    from research.llm.experiment import ExperimentConfig, run_experiment
    from research.report import format_table, runs_to_json, write_report

    # Every name is checked before the trace is read: a typo fails at once, on one line.
    _check_numbers(args)
    options = PolicyOptions(admission=args.admission)
    for name in args.policies:
        make_llm_policy(name, options)
    for profile in args.gpu:
        perf = performance_model(profile)
        if args.chunked_prefill is not None:
            problem = perf.chunk_budget_problem(args.chunked_prefill)
            if problem is not None:
                raise ValueError(f"--chunked-prefill: {problem}")
    make_predictor(args.predictor)
    trace = resolve_trace(args.trace)
    if args.requests is not None:
        trace = head(trace, args.requests)
    config = ExperimentConfig(
        trace=trace.name,
        policies=args.policies,
        workers=args.workers,
        profiles=args.gpu,
        load_scales=args.load_scale,
        predictor_errors=args.predictor_error,
        slo_scale=args.slo_scale,
        token_slos=token_slos(ttft_s=args.ttft_slo_s, tpot_s=args.tpot_slo_s),
        predictor=args.predictor,
        seeds=args.seeds,
        policy_options=options,
        chunked_prefill_tokens=args.chunked_prefill,
        prefill_workers=args.prefill_workers,
        decode_at_arrival=args.decode_at_arrival,
        heartbeat_s=args.heartbeat_s,
    )
    if args.heartbeat_s is not None:
        print(
            f"heartbeats: policies see each worker as of its last heartbeat, every "
            f"{args.heartbeat_s:g} s, plus what was sent to it since",
            file=sys.stderr,
        )
    if args.chunked_prefill is not None:
        print(
            f"chunked prefill: {args.chunked_prefill} tokens per iteration on every worker",
            file=sys.stderr,
        )
    if args.prefill_workers is not None:
        print(
            f"disaggregated: {args.prefill_workers} workers of each cluster only prefill, "
            "the rest only decode"
            + (", each decode worker chosen on arrival" if args.decode_at_arrival else ""),
            file=sys.stderr,
        )
    if args.capacity:
        return _run_capacity(args, config, trace)

    def trace_at(scale: float) -> Sequence[Any]:
        return scale_load(trace, scale).requests

    print(
        f"trace {trace.name}: {len(trace)} requests over {trace.duration_s:.0f} s "
        f"({trace.mean_rate_rps:.2f} req/s) from {trace.source}",
        file=sys.stderr,
    )
    with Progress(config.runs(), "simulate", enabled=False if args.quiet else None) as progress:

        def on_run(run: dict[str, Any]) -> None:
            progress.advance(postfix=f"{run['policy']} w{run['workers']} p99 {run['p99_s']:.2f}s")

        runs = run_experiment(config, trace_at, on_run=on_run)
    print(format_table(runs))
    described: dict[str, Any] = {**config.to_json(), "trace_source": trace.source}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"config": described, "runs": json.loads(runs_to_json(runs))}
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        print(f"runs written to {args.json}", file=sys.stderr)
    if args.report is not None:
        page = write_report(runs, described, args.report)
        print(f"report written to {page}", file=sys.stderr)
    return 0


def _run_capacity(args: argparse.Namespace, config: ExperimentConfig, trace: Trace) -> int:
    from switchyard.progress import Progress

    from research.llm.capacity_run import format_capacity_table, run_capacity

    searches = len(config.policies) * len(config.workers)
    with Progress(searches, "capacity", enabled=False if args.quiet else None) as progress:

        def on_probe(policy: str, point: CapacityPoint) -> None:
            progress.set_postfix(
                f"{policy} load x{point.load_scale:.3g}: {point.slo_attainment:.1%} met"
            )

        results = run_capacity(
            config,
            trace,
            targets=args.targets,
            on_probe=on_probe,
            on_search=lambda _: progress.advance(),
        )
    print(format_capacity_table(results), end="")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        described = {**config.to_json(), "trace_source": trace.source, "targets": args.targets}
        document = {"config": described, "capacity": results}
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        print(f"capacity written to {args.json}", file=sys.stderr)
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="switchyard simulate")
    add_arguments(parser)
    return run(parser.parse_args(argv))
