"""``switchyard service NAME`` and ``switchyard up --embedded``: running the live stack.

``service`` runs one service as its own process, configured by ``SWITCHYARD_*``
variables (what docker-compose and a process supervisor use). ``up --embedded`` runs
every service in this process over the in-memory bus and state, with the HTTP API on
``--port``.
"""

from __future__ import annotations

import argparse

from switchyard.config import Settings
from switchyard.runtime import run_service
from switchyard.runtime.loop import run

from services.catalog import SERVICE_NAMES, service_factory


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", choices=SERVICE_NAMES, metavar="NAME", help=", ".join(SERVICE_NAMES)
    )


def run_one(settings: Settings, args: argparse.Namespace) -> int:
    """Run service ``args.name`` until SIGTERM/SIGINT; returns its exit code."""
    factory = service_factory(args.name)
    return run(run_service(factory, name=args.name, settings=settings))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    from services.embedded import DEFAULT_LLM_WORKERS

    parser.add_argument(
        "--embedded",
        action="store_true",
        required=True,
        help="every service in this process over the in-memory bus and state (the only mode "
        "of `up`; run services separately with `switchyard service NAME`)",
    )
    parser.add_argument(
        "--port", type=_positive_int, default=8080, help="HTTP API port (default 8080)"
    )
    parser.add_argument(
        "--host",
        default=None,
        help="HTTP API address (default $SWITCHYARD_HTTP_HOST, else 127.0.0.1: this machine "
        "only; 0.0.0.0 serves others)",
    )
    parser.add_argument(
        "--llm-workers",
        default=",".join(DEFAULT_LLM_WORKERS),
        help="emulated LLM workers, one performance profile (GPU/model) each, comma-separated "
        f"(default {','.join(DEFAULT_LLM_WORKERS)}); emulation is a performance model, not a "
        "measurement",
    )
    parser.add_argument(
        "--prefill-workers",
        type=int,
        default=0,
        help="disaggregate prefill and decode (DistServe, Splitwise, Dynamo): the first N "
        "LLM workers only prefill, the others only decode, under any LLM policy (default 0: "
        "every worker runs both)",
    )
    parser.add_argument(
        "--transports",
        choices=("memory", "configured"),
        default="memory",
        help="memory (default): the in-memory bus and state; configured: every service "
        "connects to the bus and state store SWITCHYARD_BUS / SWITCHYARD_STATE name (Kafka "
        "and Redis) with its own connections, still in this one process",
    )
    parser.add_argument(
        "--torch-workers",
        type=_positive_int,
        default=1,
        help="workers running the real torch models (default 1)",
    )
    parser.add_argument(
        "--model-workers",
        type=_positive_int,
        default=2,
        help="emulated-models workers serving pipeline stages, placed by the placement "
        "service (default 2; each of SWITCHYARD_WORKER_CPU_CORES, _GPUS, _HOST_MEM_GIB)",
    )


def run_up(settings: Settings, args: argparse.Namespace) -> int:
    """Run the embedded stack until Ctrl-C."""
    from switchyard.perf.profiles import profile_names

    from services.embedded import EmbeddedPlan, run_embedded

    profiles = tuple(p.strip() for p in args.llm_workers.split(",") if p.strip())
    known = profile_names()
    for profile in profiles:
        if profile not in known:
            print(
                f"switchyard up: --llm-workers: unknown profile {profile!r}; known: {', '.join(known)}"
            )
            return 2
    problem = prefill_pool_problem(profiles, args.prefill_workers)
    if problem is not None:
        print(f"switchyard up: --prefill-workers: {problem}")
        return 2
    if args.host:
        settings = settings.model_copy(update={"http_host": args.host})
    plan = EmbeddedPlan(
        llm_workers=profiles,
        torch_workers=args.torch_workers,
        model_workers=args.model_workers,
        http_port=args.port,
        prefill_workers=args.prefill_workers,
    )
    return run(
        run_embedded(settings, plan, over_settings_transports=args.transports == "configured")
    )


def prefill_pool_problem(profiles: tuple[str, ...], prefill_workers: int) -> str | None:
    """Why the first ``prefill_workers`` of the LLM workers ``profiles`` cannot prefill
    for the others (None: they can, or the option is off): every model served needs a
    worker in each pool."""
    if not prefill_workers:
        return None
    from switchyard.perf.profiles import performance_model

    if not 1 <= prefill_workers < len(profiles):
        return (
            f"must leave both pools non-empty: 1 to {len(profiles) - 1} of the "
            f"{len(profiles)} LLM workers, got {prefill_workers}"
        )
    models = [performance_model(profile).model for profile in profiles]
    for model in dict.fromkeys(models):
        for pool, members in (
            ("prefill", models[:prefill_workers]),
            ("decode", models[prefill_workers:]),
        ):
            if model not in members:
                return (
                    f"{model} would have no {pool} worker (the first {prefill_workers} of "
                    f"--llm-workers {','.join(profiles)} prefill, the rest decode)"
                )
    return None
