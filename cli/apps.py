"""``switchyard apps``: build the classification application registry, or show one.

``switchyard apps build --out DIR [--seed N] [--repeats N]`` trains every variant of the
three bundled applications, profiles them on this machine and writes
``DIR/registry.json`` beside the model files. ``switchyard apps show REGISTRY`` prints
one row per application and variant. A bad input ends the command with one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from switchyard.apps.registry import Registry

__all__ = ["EXIT_BAD_INPUT", "add_arguments", "format_registry", "run"]

EXIT_BAD_INPUT = 2


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``build`` and ``show`` subcommands to ``parser`` (dest ``apps_command``)."""
    commands = parser.add_subparsers(dest="apps_command", required=True, metavar="SUBCOMMAND")
    build = commands.add_parser(
        "build",
        help="train and profile every variant; write DIR/registry.json and the model files",
        description="Train every variant of the bundled applications, profile them on "
        "this machine (worker type 'cpu') and write DIR/registry.json and the model files.",
    )
    build.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    build.add_argument(
        "--seed", type=_non_negative_int, default=0, help="training seed (default 0)"
    )
    build.add_argument(
        "--repeats",
        type=_positive_int,
        default=20,
        help="timed calls per batch size; the median is kept (default 20)",
    )
    build.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing when DIR/registry.json exists already (a deployment's one-off job)",
    )
    show = commands.add_parser(
        "show",
        help="print a registry's applications and variants",
        description="Print one row per application and variant of a registry file.",
    )
    show.add_argument("registry", type=Path, metavar="REGISTRY", help="a registry file")


def _latency_text(by_batch_s: dict[int, float], batch_size: int) -> str:
    """A profiled batch time, in milliseconds (the registry holds seconds)."""
    return f"{by_batch_s[batch_size] * 1e3:.3f}" if batch_size in by_batch_s else "-"


def _memory_text(memory_bytes: int) -> str:
    if memory_bytes >= 1 << 20:
        return f"{memory_bytes / (1 << 20):.1f} MiB"
    if memory_bytes >= 1 << 10:
        return f"{memory_bytes / (1 << 10):.1f} KiB"
    return f"{memory_bytes} B"


def format_registry(registry: Registry) -> str:
    """A plain-text table: one row per (application, variant, worker type)."""
    header = ("app", "variant", "worker", "accuracy", "b1 ms", "b32 ms", "memory")
    rows: list[tuple[str, ...]] = [header]
    for app in registry.applications:
        for name, profile in app.variants.items():
            for worker_type, by_batch in profile.latency_s.items():
                rows.append(
                    (
                        app.name,
                        name,
                        worker_type,
                        f"{profile.accuracy:.3f}",
                        _latency_text(by_batch, 1),
                        _latency_text(by_batch, 32),
                        _memory_text(profile.memory_bytes),
                    )
                )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i < 3 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _build(args: argparse.Namespace) -> int:
    from switchyard.apps.registry_file import REGISTRY_FILE, save_registry

    out_dir: Path = args.out
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out: {out_dir} exists and is not a folder")
    if args.if_missing and (out_dir / REGISTRY_FILE).is_file():
        # Before the import below: the check needs neither torch nor scikit-learn.
        print(f"{out_dir / REGISTRY_FILE} exists already; nothing to do")
        return 0
    from switchyard.apps.profiling import build_registry

    def progress(app: str, variant: str) -> None:
        print(f"profiled {app}/{variant}", file=sys.stderr)

    registry = build_registry(out_dir, seed=args.seed, repeats=args.repeats, on_variant=progress)
    path = out_dir / REGISTRY_FILE
    save_registry(registry, path)
    print(format_registry(registry))
    print(f"wrote {path}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from switchyard.apps.registry_file import load_registry

    print(format_registry(load_registry(args.registry)))
    return 0


def run(args: argparse.Namespace) -> int:
    """The command's body; returns the exit status (2 on a bad input, after one line)."""
    try:
        if args.apps_command == "build":
            return _build(args)
        return _show(args)
    except (ValueError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(f"switchyard apps {args.apps_command}: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
