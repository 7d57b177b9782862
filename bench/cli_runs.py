"""Run ``switchyard`` subcommands in-process, for the benchmarks that record a command's
tables in docs/benchmarks.md: the same parser, settings and code a user's command runs."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.config import load_settings

from cli.main import build_parser


def run_command(argv: Sequence[str]) -> None:
    """Run ``switchyard ARGV...``; raise ``SystemExit`` when the command fails."""
    print(f"\n$ switchyard {' '.join(argv)}", flush=True)
    args = build_parser(argv).parse_args(list(argv))
    status = args.func(load_settings(), args)
    if status != 0:
        raise SystemExit(f"switchyard {argv[0]} exited with {status}")
