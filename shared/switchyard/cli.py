"""The ``switchyard`` command.

Subcommands read the same SWITCHYARD_* configuration as the services. A bad
configuration or an unreachable broker ends the command with a one-line message and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable, Sequence

from switchyard import __version__
from switchyard.config import Settings, load_settings
from switchyard.errors import ConfigError, SwitchyardError
from switchyard.runtime import loop as event_loop

EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 1


def _cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    shown = settings.model_dump()
    if "redis_url" in shown:
        shown["redis_url"] = _mask_password(settings.redis_url)
    print(json.dumps(shown, indent=2, sort_keys=True))
    return 0


def _mask_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"


async def _check(settings: Settings) -> int:
    from switchyard.bus import bus_from_settings
    from switchyard.state import state_from_settings

    failures = 0
    bus = bus_from_settings(settings)
    try:
        await bus.start()
        info = await bus.ping()
        where = settings.kafka_bootstrap if settings.bus == "kafka" else "in-process"
        print(
            f"bus ({settings.bus}) at {where}: ok, cluster {info.cluster_id}, brokers {list(info.broker_ids)}"
        )
    except SwitchyardError as exc:
        failures += 1
        print(f"bus ({settings.bus}): unavailable: {exc}", file=sys.stderr)
    finally:
        await bus.stop()
    state = state_from_settings(settings)
    try:
        await state.ping()
        where = _mask_password(settings.redis_url) if settings.state == "redis" else "in-process"
        print(f"state ({settings.state}) at {where}: ok")
    except SwitchyardError as exc:
        failures += 1
        print(f"state ({settings.state}): unavailable: {exc}", file=sys.stderr)
    finally:
        await state.close()
    return EXIT_UNAVAILABLE if failures else 0


def _cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    return event_loop.run(_check(settings))


async def _topics(settings: Settings) -> int:
    from switchyard.bus import bus_from_settings
    from switchyard.contracts.topics import ALL_TOPICS

    bus = bus_from_settings(settings)
    try:
        await bus.start()  # creates the topics that are missing
        for topic in ALL_TOPICS:
            name = bus.topic_name(topic)
            partitions = await bus.transport.partitions_for(name)
            print(
                f"{name:45} {partitions:4d} partitions  {topic.type_names:22} {topic.description}"
            )
    finally:
        await bus.stop()
    return 0


def _cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    return event_loop.run(_topics(settings))


async def _dead_letters(settings: Settings, limit: int, idle_s: float) -> int:
    from switchyard.bus import bus_from_settings
    from switchyard.contracts.topics import DEAD_LETTERS

    bus = bus_from_settings(settings)
    shown = 0
    try:
        await bus.start()
        # A fresh group reads the topic from its start and leaves everyone else's offsets be.
        group = f"switchyard-cli-{uuid.uuid4().hex[:8]}"
        async with bus.subscribe(DEAD_LETTERS, group=group) as subscription:
            while shown < limit:
                delivery = await subscription.next_within(idle_s)
                if delivery is None:
                    break
                letter = delivery.message
                print(
                    json.dumps(
                        {
                            "source": f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}",
                            "group": letter.consumer_group,
                            "reason_kind": letter.reason_kind,
                            "reason": letter.reason,
                            "bytes": len(letter.original_value()),
                        }
                    )
                )
                shown += 1
    finally:
        await bus.stop()
    print(f"{shown} dead letter(s)", file=sys.stderr)
    return 0


def _cmd_dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    return event_loop.run(_dead_letters(settings, args.limit, args.idle_s))


def _cmd_demo_bus(settings: Settings, args: argparse.Namespace) -> int:
    from switchyard.demo import run_demo

    return event_loop.run(run_demo(settings, requests=args.requests))


def _cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from services.demo import run

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    return run(settings, policies, args.limit, args.speedup, log_file=args.log_file)


def _cmd_simulate(settings: Settings, args: argparse.Namespace) -> int:
    from switchyard.sim.command import run

    return run(args)


def _cmd_apps(settings: Settings, args: argparse.Namespace) -> int:
    from switchyard.apps.command import run

    return run(args)


def _cmd_sneakpeek(settings: Settings, args: argparse.Namespace) -> int:
    from switchyard.selection.command import run

    return run(args)


def _cmd_sneakpeek_accuracy(settings: Settings, args: argparse.Namespace) -> int:
    from switchyard.selection.command import run_accuracy

    return run_accuracy(args)


def _cmd_multimodel(settings: Settings, args: argparse.Namespace) -> int:
    from switchyard.multimodel.command import run

    return run(args)


def _cmd_service(settings: Settings, args: argparse.Namespace) -> int:
    from services.cli import run_one

    return run_one(settings, args)


def _cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from services.cli import run_up

    return run_up(settings, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard",
        description="Switchyard: a scheduling control plane for multi-model inference.",
    )
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[Settings, argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        return sub

    add("config", _cmd_config, "Print the effective configuration (from SWITCHYARD_* variables).")
    add("check", _cmd_check, "Check that the configured bus and state store answer.")
    add("topics", _cmd_topics, "Create the Switchyard topics that are missing and list them.")
    dead = add(
        "dead-letters", _cmd_dead_letters, "Print dead letters: messages no consumer could handle."
    )
    dead.add_argument("--limit", type=int, default=100, help="most letters to print (default 100)")
    dead.add_argument(
        "--idle-s", type=float, default=3.0, help="stop after this long without a new letter"
    )
    simulate = add(
        "simulate",
        _cmd_simulate,
        "Compare LLM scheduling policies on a trace in the discrete-event simulator.",
    )
    from switchyard.sim.command import add_arguments as add_simulate_arguments

    add_simulate_arguments(simulate)
    apps = add(
        "apps",
        _cmd_apps,
        "Build (train and profile) or show the classification application registry.",
    )
    from switchyard.apps.command import add_arguments as add_apps_arguments

    add_apps_arguments(apps)
    from switchyard.selection import command as sneakpeek_command

    sneakpeek_command.add_arguments(
        add(
            "sneakpeek",
            _cmd_sneakpeek,
            "Compare window schedulers (SneakPeek) on the classification applications.",
        )
    )
    from switchyard.multimodel import command as multimodel_command

    multimodel_command.add_arguments(
        add(
            "multimodel",
            _cmd_multimodel,
            "Compare multi-model placement policies (pipelines, heterogeneous workers).",
        )
    )
    sneakpeek_command.add_accuracy_arguments(
        add(
            "sneakpeek-accuracy",
            _cmd_sneakpeek_accuracy,
            "Error of profiled accuracy against SneakPeek's estimate, per application.",
        )
    )
    from services import cli as services_cli

    services_cli.add_service_arguments(
        add(
            "service",
            _cmd_service,
            "Run one service of the live stack (configured by SWITCHYARD_*).",
        )
    )
    services_cli.add_up_arguments(
        add("up", _cmd_up, "Run the whole live stack in this process (--embedded).")
    )
    demo = add(
        "demo",
        _cmd_demo,
        "Start the embedded stack and replay the bundled trace sample through its HTTP API.",
    )
    demo.add_argument(
        "--policies", default="gaps,jsq", help="LLM policies, one stack each (default gaps,jsq)"
    )
    demo.add_argument("--limit", type=int, default=1200, help="requests to replay (default 1200)")
    demo.add_argument(
        "--speedup", type=float, default=10.0, help="arrivals and emulated time x this (default 10)"
    )
    demo.add_argument(
        "--log-file",
        metavar="PATH",
        default=None,
        help="write the services' logs here (default "
        "$SWITCHYARD_CACHE_DIR/demo/demo-<UTC time>.log); the terminal shows the progress "
        "and the reports",
    )
    demo_bus = add(
        "demo-bus",
        _cmd_demo_bus,
        "Replay the bundled trace sample through the bus and state store (the foundation demo).",
    )
    demo_bus.add_argument("--requests", type=int, default=2000, help="requests to replay")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"switchyard {args.command}: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    try:
        code = args.func(settings, args)
    except SwitchyardError as exc:
        print(f"switchyard {args.command}: {exc}", file=sys.stderr)
        code = EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
