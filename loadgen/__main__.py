"""``python -m loadgen replay``: replay a trace open-loop against a live Switchyard ingress.

Prints a table of what was answered (stdout), writes every request's record as JSON
(``--json``) and plots with an HTML page (``--report``). Every bad input (trace, sample
name, application map, number, unreachable target) ends the command with one line on
stderr naming it and exit status 2. Ctrl-C stops sending, waits a few seconds for the
answers in flight (a second Ctrl-C stops waiting), prints the report of what was
answered and exits with status 130.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from loadgen.mixes import PlannedRequest
    from loadgen.replay_records import ReplayResult

PROG = "python -m loadgen"
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

DESCRIPTION = """\
Replay a trace against a Switchyard ingress, open-loop: request i is sent at
(t_i - t_0) / speedup seconds after the start, however the earlier ones are doing.
LLM rows become POST {target}/v1/completions (model from --app-map, max_tokens the
row's generated tokens, switchyard.prompt_tokens its context tokens); classification
requests are POST {target}/v1/apps/{app}/infer with held-out rows of the bundled
datasets (digits, fraud-like, wine-dominant; needs scikit-learn).

--mix multimodel takes no --trace: it replays the requests of the bundled Alibaba
GenAI LoRA sample as pipeline calls, POST {target}/v1/apps/{pipeline}/infer with
{"request_id", "exec_scale", "input"}, to the pipelines of the stack's alibaba-lora
catalogue (start the stack with SWITCHYARD_PIPELINE_CATALOGUE=alibaba-lora). Its
arrival times are the multi-model simulator's (trace time / 1000): with emulated
workers at SWITCHYARD_WORKER_TIME_SCALE=T, pass --speedup T so the offered load
matches the simulator's. --seed draws which calls go to the multi-stage pipelines
(0, the default, is the draw the catalogue is built with; every seed calls only the
catalogue's pipelines)."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m loadgen`` with its ``replay`` subcommand."""
    from switchyard.traces import trace_help

    parser = _Parser(prog=PROG, description="Switchyard's load generator.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = commands.add_parser(
        "replay",
        help="replay a trace open-loop against a live ingress",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="trace specs:\n  " + trace_help().replace("\n", "\n  "),
    )
    replay.add_argument(
        "--trace",
        default=None,
        metavar="PATH_OR_NAME",
        help="an Azure-format CSV path or a trace name (azure-conv-sample, azure-code-sample, "
        "azure-mix-sample, azure-conv, ..., poisson:..., see below); required, except "
        "with --mix multimodel, which replays the bundled Alibaba LoRA sample",
    )
    replay.add_argument(
        "--target", required=True, metavar="URL", help="the ingress base URL, e.g. http://127.0.0.1:8000"
    )  # fmt: skip
    replay.add_argument(
        "--api-key", default=os.environ.get("SWITCHYARD_API_KEY"), metavar="KEY",
        help="sent as Authorization: Bearer KEY, for an ingress with API keys "
        "(default: $SWITCHYARD_API_KEY)",
    )  # fmt: skip
    replay.add_argument(
        "--speedup", type=float, default=1.0,
        help="divide the trace's inter-arrival times by this (default 1)",
    )  # fmt: skip
    replay.add_argument("--limit", type=int, default=None, metavar="N", help="the first N rows")
    replay.add_argument(
        "--mix", default="llm",
        help="llm (default), classification, mixed, or multimodel (pipeline calls of the "
        "bundled Alibaba LoRA sample; arrivals in simulator seconds: --speedup the workers' "
        "time scale)",
    )  # fmt: skip
    replay.add_argument(
        "--classification-share", type=float, default=None, metavar="F",
        help="with --mix mixed, the fraction of rows sent as classification (default 0.5)",
    )  # fmt: skip
    replay.add_argument(
        "--app-map", default=None, metavar="WORKLOAD=APP,...",
        help="LLM application per workload (default conversation=llama-2-7b,"
        "code=llama-2-13b,other=llama-2-7b)",
    )  # fmt: skip
    replay.add_argument(
        "--seed", type=int, default=0,
        help="seeds the mix, the classification rows, synthetic traces and which multimodel "
        "calls go to multi-stage pipelines (default 0)",
    )  # fmt: skip
    replay.add_argument(
        "--timeout-s", type=float, default=120.0, metavar="S",
        help="client timeout per request in seconds (default 120)",
    )  # fmt: skip
    replay.add_argument(
        "--json", type=Path, default=None, metavar="OUT",
        help="write {config, summary, per_app, requests} here",
    )  # fmt: skip
    replay.add_argument(
        "--report", type=Path, default=None, metavar="DIR",
        help="write plots, index.html and replay.json into DIR (needs matplotlib)",
    )  # fmt: skip
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _check_numbers(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.speedup) and args.speedup > 0):
        raise ValueError(f"--speedup must be a finite number > 0, got {args.speedup:g}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise ValueError(f"--timeout-s must be a finite number > 0, got {args.timeout_s:g}")
    share = args.classification_share
    if share is not None:
        if args.mix != "mixed":
            raise ValueError("--classification-share applies only with --mix mixed")
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise ValueError(f"--classification-share must be within [0, 1], got {share:g}")


def _check_trace(args: argparse.Namespace) -> None:
    """``--trace`` is required by the mixes of a trace and refused by ``multimodel``."""
    if args.mix == "multimodel":
        if args.trace is not None:
            raise ValueError(
                "--trace: --mix multimodel replays the bundled Alibaba LoRA sample "
                "(the stack's alibaba-lora catalogue) and takes no trace; drop --trace"
            )
        if args.app_map is not None:
            raise ValueError("--app-map applies to LLM rows; --mix multimodel sends none")
    elif args.trace is None:
        raise ValueError(f"--trace is required with --mix {args.mix}")


def _raise_file_limit() -> None:
    """Lift the soft open-file limit to the hard one: one connection per request in flight."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else 65536
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def _run_replay(args: argparse.Namespace, plan: Sequence[PlannedRequest]) -> ReplayResult:
    """Check the target, then replay with Ctrl-C (and SIGTERM) wired to a graceful stop."""
    from loadgen.replay import DEFAULT_GRACE_S, replay
    from loadgen.replay_target import check_reachable

    await check_reachable(args.target)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    abort = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            abort.set()
            return
        stop.set()
        print(
            f"\nstopping: no more requests are sent; waiting up to {DEFAULT_GRACE_S:g} s for "
            "the answers in flight (Ctrl-C again to stop waiting)",
            file=sys.stderr,
        )

    installed: list[signal.Signals] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        return await replay(
            plan,
            args.target,
            speedup=args.speedup,
            timeout_s=args.timeout_s,
            progress=not args.no_progress,
            stop=stop,
            abort=abort,
            api_key=args.api_key,
        )
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def replay_command(args: argparse.Namespace) -> int:
    """The body of ``replay``; returns the exit status (errors propagate)."""
    from switchyard.runtime import loop as event_loop
    from switchyard.traces import resolve_trace

    from loadgen.mixes import (
        MULTIMODEL_CATALOGUE,
        build_plan,
        check_mix_name,
        multimodel_plan,
        parse_app_map,
    )
    from loadgen.replay_report import report_document, write_json, write_report
    from loadgen.replay_summary import per_app_summaries, summarize
    from loadgen.replay_target import normalise_target
    from loadgen.replay_text import format_report

    # Every argument is checked before the trace is read: a typo fails at once.
    check_mix_name(args.mix)
    _check_trace(args)
    _check_numbers(args)
    app_map = parse_app_map(args.app_map)
    args.target = normalise_target(args.target)
    share = 0.5 if args.classification_share is None else args.classification_share
    config: dict[str, Any]
    if args.mix == "multimodel":
        from switchyard.traces.alibaba import LORA_SAMPLE

        plan = multimodel_plan(args.limit, args.seed)
        config = {
            "trace": "alibaba-lora-sample",
            "trace_source": str(LORA_SAMPLE),
            "mix": args.mix,
            "limit": args.limit,
            "seed": args.seed,
            "pipeline_catalogue": MULTIMODEL_CATALOGUE,
        }
    else:
        trace = resolve_trace(args.trace, seed=args.seed)
        plan = build_plan(
            trace, args.mix, args.limit, args.seed, classification_share=share, app_map=app_map
        )
        config = {
            "trace": trace.name,
            "trace_source": trace.source,
            "mix": args.mix,
            "limit": args.limit,
            "seed": args.seed,
            "app_map": {workload.value: app for workload, app in app_map.items()},
        }
    if args.mix == "mixed":
        config["classification_share"] = share
    _raise_file_limit()
    result = event_loop.run(_run_replay(args, plan))

    summary = summarize(result.records, result.duration_s)
    per_app = per_app_summaries(result.records, result.duration_s)
    shown = {
        **config,
        "target": result.target,
        "speedup": f"x{result.speedup:g}",
        "generator_cpu_s": result.cpu_s,
        "generator_cpu_ms_per_request": result.cpu_ms_per_request,
    }
    print(format_report(summary, per_app, shown), end="")
    if args.json is not None:
        write_json(report_document(result, config), args.json)
        print(f"records written to {args.json}", file=sys.stderr)
    if args.report is not None:
        page = write_report(result, args.report, config)
        print(f"report written to {page}", file=sys.stderr)
    return EXIT_INTERRUPTED if result.stopped else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m loadgen`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    from switchyard.errors import SwitchyardError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or an argparse error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    try:
        return replay_command(args)
    except (ValueError, OSError, SwitchyardError) as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
