"""``switchyard multimodel``: compare placement policies for multi-model pipelines on
heterogeneous workers, in the multi-model simulator (:mod:`research.multimodel.simulator`).

Without ``--sweep`` every policy runs once per seed on one setting; with ``--sweep`` one
parameter takes each of ``--values`` (defaults below) and every run in the JSON carries
``sweep`` and ``value``. Prints a table (means over seeds), writes the runs as JSON
(``--json``) and PNG plots of each metric against the swept value with an
``index.html`` (``--report``). Every bad input ends the command with one line naming it
and exit status 2.

The workloads: ``lora`` (the Alibaba GenAI LoRA trace mix, on Alibaba GPU nodes),
``synthetic``, and ``assistant`` (:mod:`research.multimodel.assistant`: the live stack's
pipelines with LLM stages, their LLM stages on simulated LLM workers sized by
``--llm-workers`` and placed by ``--llm-policy``).

The sweeps:

* ``update-frequency``: placement updates per second (0.2, 0.5, 1, 2, 4 Hz), each
  update's cost charged in virtual time (see :mod:`research.multimodel.simulator`).
* ``fluctuation``: load fluctuation intensity of the synthetic workload (0 .. 1).
* ``heterogeneity``: share of slow workers in the cluster (0 .. 1).
* ``invocation-ratio``: model invocation ratio of the synthetic workload (0 .. 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from switchyard.errors import SwitchyardError

from research.args import comma_list
from research.multimodel.assistant import ASSISTANT_INPUT_TOKENS
from research.multimodel.command_report import format_table, write_report
from research.report.runs import json_ready

EXIT_BAD_INPUT = 2

SWEEP_DEFAULTS: dict[str, tuple[float, ...]] = {
    "update-frequency": (0.2, 0.5, 1.0, 2.0, 4.0),
    "fluctuation": (0.0, 0.25, 0.5, 0.75, 1.0),
    "heterogeneity": (0.0, 0.25, 0.5, 0.75, 1.0),
    "invocation-ratio": (0.0, 0.25, 0.5, 0.75, 1.0),
}
WORKLOADS = ("lora", "synthetic", "assistant")


class CommandError(SwitchyardError):
    """A bad argument, reported as one line."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``switchyard multimodel``."""
    parser.add_argument(
        "--workload", default="lora",
        help="lora (the Alibaba GenAI LoRA trace mix), synthetic, or assistant (the live "
        "stack's pipelines with LLM stages: a draft checked by a larger model, a classifier "
        "routing to one of two LLMs) (default lora)",
    )  # fmt: skip
    parser.add_argument(
        "--cluster", default=None,
        help="alibaba (GPU nodes of the Alibaba node list) or synthetic (two speeds); "
        "default alibaba for --workload lora, synthetic otherwise",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=16, help="cluster size (default 16)")
    parser.add_argument(
        "--models", type=int, default=None,
        help="lora: keep the N most requested base models; synthetic: N models "
        "(default: the workload's own)",
    )  # fmt: skip
    parser.add_argument(
        "--rate-rps", type=float, default=None,
        help="synthetic: mean arrival rate (default 2 per worker)",
    )  # fmt: skip
    parser.add_argument(
        "--step-factor", type=float, default=2.0,
        help="synthetic and assistant: the rate is multiplied by this from half the "
        "duration on (responsiveness); 1 means no step (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--pipelines", type=comma_list(str, "--pipelines"), default=None,
        help="assistant: comma-separated pipelines the calls go to, uniformly "
        "(default all: triage, draft-verify)",
    )  # fmt: skip
    parser.add_argument(
        "--input-tokens", type=int, default=ASSISTANT_INPUT_TOKENS,
        help=f"assistant: a call's input in tokens (default {ASSISTANT_INPUT_TOKENS})",
    )  # fmt: skip
    parser.add_argument(
        "--llm-workers", default=None, metavar="MODEL=PROFILE[:COUNT],...",
        help="assistant: the LLM workers of each LLM model, e.g. "
        "llama-2-13b=a100-80gb/llama-2-13b:2,llama-2-7b=l40s-48gb/llama-2-7b "
        "(default one a100-80gb worker per model)",
    )  # fmt: skip
    parser.add_argument(
        "--llm-policy", type=comma_list(str, "--llm-policy"), default=None,
        help="assistant: the LLM policy placing LLM stages (one of `switchyard simulate "
        "--policies`; default the live stack's, gaps); several, comma-separated, are each "
        "run with every placement policy",
    )  # fmt: skip
    parser.add_argument(
        "--time-scale", type=float, default=None,
        help="lora: trace seconds per simulated second (default the workload's own)",
    )  # fmt: skip
    parser.add_argument(
        "--sweep", default=None, choices=tuple(SWEEP_DEFAULTS),
        help="the parameter to sweep (default: none, one setting)",
    )  # fmt: skip
    parser.add_argument(
        "--values", type=comma_list(float, "--values"), default=None,
        help="comma-separated values of the swept parameter (defaults: update-frequency "
        "0.2,0.5,1,2,4; the others 0,0.25,0.5,0.75,1)",
    )  # fmt: skip
    parser.add_argument(
        "--policies", type=comma_list(str, "--policies"), default=None,
        help="comma-separated placement policies (default all registered)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=1, help="seeds per setting (default 1)")
    parser.add_argument(
        "--duration-s", type=float, default=300.0, help="workload length in seconds (default 300)"
    )
    parser.add_argument(
        "--update-hz", type=float, default=1.0,
        help="placement updates per second when not swept (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--decision-base-s", type=float, default=0.05,
        help="routing pause charged per update, virtual seconds (default 0.05)",
    )  # fmt: skip
    parser.add_argument(
        "--decision-per-change-s", type=float, default=0.01,
        help="extra routing pause per load or eviction (default 0.01)",
    )  # fmt: skip
    parser.add_argument(
        "--large-change", type=float, default=0.5,
        help="relative demand change of a model that triggers an extra update; 0 turns "
        "it off (default 0.5)",
    )  # fmt: skip
    parser.add_argument(
        "--window-s", type=float, default=5.0, help="latency window of the metrics (default 5)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write runs here")
    parser.add_argument(
        "--report", type=Path, default=None, metavar="DIR", help="write PNG plots and index.html"
    )


def run(args: argparse.Namespace) -> int:
    """The command's body; returns the exit status (2 for bad input, one line)."""
    try:
        return _run(args)
    except (ValueError, OSError, SwitchyardError, ImportError, KeyError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"switchyard multimodel: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT


# --------------------------------------------------------------------------- the data side


def policy_names() -> tuple[str, ...]:
    from switchyard.multimodel.policy_registry import multimodel_policy_names

    return tuple(multimodel_policy_names())


def make_policy(name: str) -> Any:
    """The registered policy ``name``: an object with ``.name``, ``.placement``, ``.router``."""
    from switchyard.multimodel.policy_registry import make_multimodel_policy

    return make_multimodel_policy(name)


def build_workers(
    args: argparse.Namespace, sweep: str | None, value: float | None, seed: int
) -> Any:
    from research.multimodel.cluster import alibaba_cluster, synthetic_cluster

    cluster = args.cluster or ("alibaba" if args.workload == "lora" else "synthetic")
    heterogeneity = value if sweep == "heterogeneity" else None
    if cluster == "alibaba":
        return alibaba_cluster(args.workers, seed, heterogeneity)
    return synthetic_cluster(
        args.workers, heterogeneity if heterogeneity is not None else 0.5, seed
    )


ASSISTANT_RATE_RPS = 4.0
"""``--workload assistant``'s calls a second without ``--rate-rps``."""


def _pipelines(args: argparse.Namespace) -> tuple[str, ...]:
    from switchyard.serving.pipelines import ASSISTANT_PIPELINES

    return tuple(args.pipelines) if args.pipelines is not None else tuple(ASSISTANT_PIPELINES)


def build_llm_workers(args: argparse.Namespace) -> tuple[Any, ...]:
    """``--workload assistant``'s LLM workers (none for the other workloads)."""
    if args.workload != "assistant":
        return ()
    from research.multimodel.assistant import parse_llm_workers

    return parse_llm_workers(args.llm_workers, _pipelines(args))


def llm_policies(args: argparse.Namespace) -> tuple[str, ...]:
    """The LLM policies placing LLM stages, each run in turn: ``--llm-policy``, else the
    live stack's default."""
    if args.llm_policy is not None:
        return tuple(args.llm_policy)
    from switchyard.config import Settings

    return (str(Settings.model_fields["llm_policy"].default),)


def build_workload(
    args: argparse.Namespace, sweep: str | None, value: float | None, seed: int
) -> Any:
    """The workload of one setting: the LoRA trace mix cut at ``--duration-s``, or the
    synthetic mix (a step of ``--step-factor`` at half the duration, for responsiveness)."""
    from switchyard.multimodel.model import Workload

    from research.multimodel.workload import lora_workload, synthetic_workload

    if args.workload == "assistant":
        from research.multimodel.assistant import assistant_workload

        return assistant_workload(
            rate_rps=args.rate_rps if args.rate_rps is not None else ASSISTANT_RATE_RPS,
            duration_s=args.duration_s,
            seed=seed,
            pipelines=_pipelines(args),
            input_tokens=args.input_tokens,
            step_factor=args.step_factor,
            step_at_s=args.duration_s / 2 if args.step_factor != 1.0 else None,
        )
    if args.workload == "lora":
        kwargs: dict[str, Any] = {"seed": seed}
        if args.models is not None:
            kwargs["models"] = args.models
        if args.time_scale is not None:
            kwargs["time_scale"] = args.time_scale
        full = lora_workload(**kwargs)
        requests = tuple(r for r in full.requests if r.arrival_s < args.duration_s)
        return Workload(
            name=full.name,
            models=full.models,
            pipelines=full.pipelines,
            requests=requests,
            step_at_s=full.step_at_s
            if full.step_at_s is None or full.step_at_s < args.duration_s
            else None,
        )
    kwargs = {
        "seed": seed,
        "duration_s": args.duration_s,
        "rate_rps": args.rate_rps if args.rate_rps is not None else 2.0 * args.workers,
    }
    if args.models is not None:
        kwargs["models"] = args.models
    if args.step_factor != 1.0:
        kwargs["step_factor"] = args.step_factor
        kwargs["step_at_s"] = args.duration_s / 2
    if sweep == "fluctuation" and value is not None:
        kwargs["fluctuation"] = value
    if sweep == "invocation-ratio" and value is not None:
        kwargs["invocation_ratio"] = value
    return synthetic_workload(**kwargs)


# --------------------------------------------------------------------------- the runs


def _check(args: argparse.Namespace) -> tuple[tuple[float | None, ...], tuple[str, ...]]:
    if args.workload not in WORKLOADS:
        raise CommandError(
            f"--workload must be one of {', '.join(WORKLOADS)}, got {args.workload!r}"
        )
    if args.cluster not in (None, "alibaba", "synthetic"):
        raise CommandError(f"--cluster must be alibaba or synthetic, got {args.cluster!r}")
    if args.workers < 1:
        raise CommandError(f"--workers must be at least 1, got {args.workers}")
    if args.seeds < 1:
        raise CommandError(f"--seeds must be at least 1, got {args.seeds}")
    positive = {
        "--duration-s": args.duration_s,
        "--update-hz": args.update_hz,
        "--window-s": args.window_s,
    }
    for name, number in positive.items():
        if not (math.isfinite(number) and number > 0):
            raise CommandError(f"{name} must be a number > 0, got {number:g}")
    for name, optional in {
        "--models": args.models,
        "--rate-rps": args.rate_rps,
        "--time-scale": args.time_scale,
    }.items():
        if optional is not None and not (math.isfinite(optional) and optional > 0):
            raise CommandError(f"{name} must be a number > 0, got {optional:g}")
    if not (math.isfinite(args.step_factor) and args.step_factor > 0):
        raise CommandError(f"--step-factor must be a number > 0, got {args.step_factor:g}")
    for name, number in {
        "--decision-base-s": args.decision_base_s,
        "--decision-per-change-s": args.decision_per_change_s,
        "--large-change": args.large_change,
    }.items():
        if not (math.isfinite(number) and number >= 0):
            raise CommandError(f"{name} must be a number >= 0, got {number:g}")
    if args.sweep is not None and args.sweep not in SWEEP_DEFAULTS:
        raise CommandError(
            f"--sweep must be one of {', '.join(SWEEP_DEFAULTS)}, got {args.sweep!r}"
        )
    if args.sweep is None:
        if args.values is not None:
            raise CommandError("--values needs --sweep")
        values: tuple[float | None, ...] = (None,)
    else:
        values = tuple(args.values) if args.values is not None else SWEEP_DEFAULTS[args.sweep]
        for value in values:
            assert value is not None
            if args.sweep == "update-frequency":
                if not (math.isfinite(value) and value > 0):
                    raise CommandError(
                        f"--values: an update frequency must be > 0 Hz, got {value:g}"
                    )
            elif not 0.0 <= value <= 1.0:
                raise CommandError(f"--values: {args.sweep} must be within [0, 1], got {value:g}")
    if args.workload != "synthetic" and args.sweep in ("fluctuation", "invocation-ratio"):
        raise CommandError(f"--sweep {args.sweep} needs --workload synthetic")
    if args.workload == "assistant":
        if args.models is not None or args.time_scale is not None:
            raise CommandError("--models and --time-scale do not apply to --workload assistant")
        if args.input_tokens < 1:
            raise CommandError(f"--input-tokens must be at least 1, got {args.input_tokens}")
        from switchyard.serving.pipelines import ASSISTANT_PIPELINES

        for name in _pipelines(args):
            if name not in ASSISTANT_PIPELINES:
                raise CommandError(
                    f"unknown --pipelines {name!r}; known: {', '.join(ASSISTANT_PIPELINES)}"
                )
        from switchyard.policies.registry import llm_policy_names

        for name in llm_policies(args):
            if name not in llm_policy_names():
                raise CommandError(
                    f"unknown --llm-policy {name!r}; known: {', '.join(llm_policy_names())}"
                )
    else:
        given = {
            "--pipelines": args.pipelines is not None,
            "--llm-workers": args.llm_workers is not None,
            "--llm-policy": args.llm_policy is not None,
            "--input-tokens": args.input_tokens != ASSISTANT_INPUT_TOKENS,
        }
        for name, is_given in given.items():
            if is_given:
                raise CommandError(f"{name} needs --workload assistant")
    known = policy_names()
    policies = tuple(args.policies) if args.policies is not None else known
    for name in policies:
        if name not in known:
            raise CommandError(f"unknown policy {name!r}; known: {', '.join(known)}")
    return values, policies


def _run(args: argparse.Namespace) -> int:
    from research.multimodel.metrics import summarize
    from research.multimodel.simulator import MultiModelSimConfig, simulate_multimodel

    values, policies = _check(args)
    config = {
        "workload": args.workload,
        "cluster": args.cluster or ("alibaba" if args.workload == "lora" else "synthetic"),
        "workers": args.workers,
        "models": args.models,
        "rate_rps": args.rate_rps,
        "step_factor": args.step_factor,
        "time_scale": args.time_scale,
        "sweep": args.sweep,
        "values": list(values),
        "policies": list(policies),
        "seeds": args.seeds,
        "duration_s": args.duration_s,
        "update_hz": args.update_hz,
        "decision_base_s": args.decision_base_s,
        "decision_per_change_s": args.decision_per_change_s,
        "large_change": args.large_change,
        "window_s": args.window_s,
    }
    llm_workers = build_llm_workers(args)
    if llm_workers:
        config["pipelines"] = list(_pipelines(args))
        config["input_tokens"] = args.input_tokens
        config["llm_workers"] = {w.application: list(w.profiles) for w in llm_workers}
        config["llm_policies"] = list(llm_policies(args))
    runs: list[dict[str, Any]] = []
    for value in values:
        for seed in range(args.seeds):
            workers = build_workers(args, args.sweep, value, seed)
            workload = build_workload(args, args.sweep, value, seed)
            hz = value if args.sweep == "update-frequency" and value is not None else args.update_hz
            sim_config = MultiModelSimConfig(
                update_hz=hz,
                decision_base_s=args.decision_base_s,
                decision_per_change_s=args.decision_per_change_s,
                large_change=args.large_change or None,
                window_s=args.window_s,
                seed=seed,
            )
            # Without LLM workers there is no LLM policy to vary: one pass, its name unused.
            compared = llm_policies(args) if llm_workers else (None,)
            for name, llm in [(name, llm) for name in policies for llm in compared]:
                policy = make_policy(name)
                config_run = sim_config if llm is None else replace(sim_config, llm_policy=llm)
                result = simulate_multimodel(
                    workload, workers, policy.placement, policy.router, config_run, llm_workers
                )
                metrics = summarize(result).as_dict()
                label = getattr(policy, "name", name)
                run = {
                    # With several LLM policies a row is a pair: placement / LLM policy.
                    "policy": label if len(compared) == 1 else f"{label} / {llm}",
                    "llm_policy": llm,
                    "sweep": args.sweep,
                    "value": value,
                    "seed": seed,
                    **metrics,
                }
                runs.append(run)
                print(
                    f"  {run['policy']} {args.sweep or ''} {'' if value is None else f'{value:g}'} "
                    f"seed {seed}: util {run['utilization']:.1f}% p99 {run['p99_s']:.2f}s",
                    file=sys.stderr,
                )
    table = format_table(runs)
    print(table)
    document = {"config": config, "runs": runs}
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(json_ready(document), indent=2) + "\n")
        except OSError as exc:
            raise CommandError(f"cannot write {args.json}: {exc.strerror or exc}") from None
        print(f"runs written to {args.json}", file=sys.stderr)
    if args.report is not None:
        page = write_report(runs, config, table, args.report)
        print(f"report written to {page}", file=sys.stderr)
    return 0
