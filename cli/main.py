"""The ``switchyard`` command: the top layer, one subcommand per job.

Subcommands read the same SWITCHYARD_* configuration as the services. A bad
configuration or an unreachable broker ends the command with a one-line message and a
non-zero exit status, never a traceback. Each command imports what it runs only when it
runs, so ``switchyard service NAME`` starts without the research tools, and an
installation without them (the service image) lists their commands as unavailable.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from switchyard import __version__
from switchyard.config import Settings, load_settings
from switchyard.errors import ConfigError, SwitchyardError
from switchyard.runtime import loop as event_loop

from cli import ops
from cli.exit_codes import EXIT_CONFIG, EXIT_UNAVAILABLE

Command = Callable[[Settings, argparse.Namespace], int]
AddCommand = Callable[[str, Command, str], argparse.ArgumentParser]

# The research tools' commands: name, help, the module that runs it, its argument
# function and its run function (both take the parsed arguments).
RESEARCH_COMMANDS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "simulate",
        "Compare LLM scheduling policies on a trace in the discrete-event simulator.",
        "research.llm.command",
        "add_arguments",
        "run",
    ),
    (
        "window",
        "Compare window schedulers (SneakPeek and its baselines) on the classification "
        "applications, in the window simulator.",
        "research.window.command",
        "add_arguments",
        "run",
    ),
    (
        "estimates",
        "Error of profiled accuracy against the estimator's per-request estimates, per "
        "application.",
        "research.window.estimates_command",
        "add_accuracy_arguments",
        "run_accuracy",
    ),
    (
        "multimodel",
        "Compare multi-model placement policies (pipelines, heterogeneous workers).",
        "research.multimodel.command",
        "add_arguments",
        "run",
    ),
)


def _cmd_demo_bus(settings: Settings, args: argparse.Namespace) -> int:
    from cli.bus_demo import run_demo

    return event_loop.run(run_demo(settings, requests=args.requests))


def _cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from cli.stack_demo import run

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    return run(settings, policies, args.limit, args.speedup, log_file=args.log_file)


def _cmd_service(settings: Settings, args: argparse.Namespace) -> int:
    from services.launch import run_one

    return run_one(settings, args)


def _cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from services.launch import run_up

    return run_up(settings, args)


def _research_command(module_name: str, run_name: str) -> Command:
    def command(settings: Settings, args: argparse.Namespace) -> int:
        module = importlib.import_module(module_name)
        run: Callable[[argparse.Namespace], int] = getattr(module, run_name)
        return run(args)

    return command


def _research_missing(settings: Settings, args: argparse.Namespace) -> int:
    print(
        f"switchyard {args.command}: the research tools are not installed here (the service "
        "image leaves them out); run it from a source checkout (pip install -e .)",
        file=sys.stderr,
    )
    return EXIT_CONFIG


def _add_research_commands(add: AddCommand, chosen: str | None) -> None:
    """The research commands. Only the one ``chosen`` imports its module (for its
    arguments): the others cost a service's start-up nothing."""
    for name, help_text, module_name, arguments_name, run_name in RESEARCH_COMMANDS:
        command = _research_command(module_name, run_name)
        if name != chosen:
            add(name, command, help_text)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("research"):
                raise
            add(name, _research_missing, f"{help_text} (not installed here)")
            continue
        getattr(module, arguments_name)(add(name, command, help_text))


def _cmd_apps(settings: Settings, args: argparse.Namespace) -> int:
    from cli.apps import run

    return run(args)


def _cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from cli.status import run

    return run(settings, args)


def _cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    from cli.keys import run

    return run(settings, args)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (default: this process's arguments), whose command alone
    has its research module imported."""
    words = sys.argv[1:] if argv is None else argv
    chosen = next((word for word in words if not word.startswith("-")), None)
    parser = argparse.ArgumentParser(
        prog="switchyard",
        description="Switchyard: a scheduling control plane for multi-model inference.",
    )
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        return sub

    add(
        "config", ops.cmd_config, "Print the effective configuration (from SWITCHYARD_* variables)."
    )
    add("check", ops.cmd_check, "Check that the configured bus and state store answer.")
    add("topics", ops.cmd_topics, "Create the Switchyard topics that are missing and list them.")
    dead = add(
        "dead-letters",
        ops.cmd_dead_letters,
        "Print dead letters: messages no consumer could handle.",
    )
    dead.add_argument("--limit", type=int, default=100, help="most letters to print (default 100)")
    dead.add_argument(
        "--idle-s", type=float, default=3.0, help="stop after this long without a new letter"
    )
    from cli.status import add_arguments as add_status_arguments

    add_status_arguments(
        add(
            "status",
            _cmd_status,
            "Show the live stack at a glance (workers, services, rates, SLO attainment, dead "
            "letters), refreshed like top.",
        )
    )
    apps = add(
        "apps",
        _cmd_apps,
        "Build (train and profile) or show the classification application registry.",
    )
    from cli.apps import add_arguments as add_apps_arguments

    add_apps_arguments(apps)
    from cli.keys import add_arguments as add_keys_arguments

    add_keys_arguments(
        add("keys", _cmd_keys, "Make API keys for tenants (SWITCHYARD_AUTH=api-key).")
    )
    from services import launch

    launch.add_service_arguments(
        add(
            "service",
            _cmd_service,
            "Run one service of the live stack (configured by SWITCHYARD_*).",
        )
    )
    launch.add_up_arguments(
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
    _add_research_commands(add, chosen)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser(argv)
    # A research command that is not installed takes any arguments: it only says so.
    args, extra = parser.parse_known_args(argv)
    if extra and args.func is not _research_missing:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
