"""``switchyard window`` (``switchyard estimates`` is :mod:`research.window.estimates_command`).

``switchyard window --schedulers a,b,...`` runs each window scheduler over the same
seeded workloads in the window simulator (:mod:`research.window.simulator`: real data, real
model variants, SneakPeek estimates, virtual time on an *emulated edge device* whose
latencies are the profiled CPU figures x ``--latency-scale``), prints one row per
scheduler (means over ``--seeds``), and writes the runs as JSON (``--json``) and
charts with an HTML page (``--report``: :mod:`research.window.plots`).

``--regime NAME`` starts from a named configuration (:mod:`research.window.regimes`:
``default``, ``constrained``, ``paper``); flags given besides it win.

``--sweep NAME [--values v1,v2,...]`` runs the paper's sweeps
(:mod:`research.window.sweep`: deadline, deadline-std, apps, requests-per-window,
penalty, heterogeneity, and the device's latency-scale and load-scale): every value
runs every scheduler for every seed; the table has one block per value, each run in the
JSON carries ``sweep`` and ``value``, and the report adds utility and deadline
violation rate against the swept value.

Without ``--registry`` both commands build the bundled registry (train and profile, about 10 s)
once into ``$XDG_CACHE_HOME/switchyard/apps/<train seed>`` (default ``~/.cache``) and
reuse it afterwards. Every bad input ends the command with one line on stderr and exit
status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from switchyard.apps.registry import Registry
from switchyard.selection.base import WindowScheduler

from research.window.regimes import REGIMES, regime_named
from research.window.sweep import SWEEPS, Sweep, SweepValue, parse_values, sweep_named

__all__ = [
    "EXIT_BAD_INPUT",
    "BadInputError",
    "SchedulerFactory",
    "add_arguments",
    "cache_dir",
    "fail",
    "registry_arguments",
    "resolve_registry",
    "run",
]

EXIT_BAD_INPUT = 2
SchedulerFactory = Callable[[], WindowScheduler]


class BadInputError(ValueError):
    """A bad argument, reported as one line."""


def cache_dir(train_seed: int) -> Path:
    """Where the bundled registry built with ``train_seed`` is cached."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "switchyard" / "apps" / str(train_seed)


def resolve_registry(path: Path | None, train_seed: int = 0) -> tuple[Registry, Path]:
    """The registry and its folder: ``path``, or the cached bundled build (built if absent).

    Raises:
        RegistryError: an unreadable or invalid registry file (one line naming the field).
    """
    from switchyard.apps.profiling import build_registry
    from switchyard.apps.registry_file import REGISTRY_FILE, load_registry, save_registry

    if path is not None:
        return load_registry(path), path.parent
    folder = cache_dir(train_seed)
    file = folder / REGISTRY_FILE
    if not file.exists():
        print(f"building the bundled registry into {folder} (once)", file=sys.stderr)
        registry = build_registry(folder, seed=train_seed)
        save_registry(registry, file)
    return load_registry(file), folder


def _default_factories(tau: int | None) -> tuple[Mapping[str, SchedulerFactory], str]:
    """The registered schedulers, imported only when the command runs."""
    try:
        from switchyard.selection import registry as scheduler_registry
    except ImportError as exc:  # the schedulers are not there yet
        raise BadInputError(f"no window schedulers are available: {exc}") from None
    names = tuple(scheduler_registry.window_scheduler_names())

    def factory(name: str) -> SchedulerFactory:
        if tau is None:
            return lambda: scheduler_registry.make_window_scheduler(name)
        return lambda: scheduler_registry.make_window_scheduler(name, tau=tau)

    return {name: factory(name) for name in names}, ",".join(names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``switchyard window`` options."""
    parser.add_argument(
        "--schedulers",
        default=None,
        help="comma-separated window schedulers (default: every registered one)",
    )
    parser.add_argument(
        "--regime",
        default=None,
        metavar="NAME",
        help=f"a named configuration ({', '.join(REGIMES)}; research/window/regimes.py); "
        "flags given besides it win",
    )
    parser.add_argument("--requests-per-window", type=int, default=None, help="default 12")
    parser.add_argument(
        "--window-s", type=float, default=None, help="window length, seconds (default 0.1)"
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="mean relative deadline, seconds (default 0.15)",
    )
    parser.add_argument(
        "--deadline-std-s",
        type=float,
        default=0.0,
        help="standard deviation of the deadline, seconds (default 0)",
    )
    parser.add_argument(
        "--apps",
        type=int,
        default=None,
        help="applications taking part (default: all; more than the registry runs copies)",
    )
    parser.add_argument("--workers", type=int, default=None, help="default 1")
    parser.add_argument(
        "--penalty",
        default=None,
        help="step, linear or sigmoid for every application (default: each one's own)",
    )
    parser.add_argument("--windows", type=int, default=50, help="windows per run (default 50)")
    parser.add_argument(
        "--latency-scale",
        type=float,
        default=None,
        help="emulated edge device: profiled batch latency x this (default 100)",
    )
    parser.add_argument(
        "--load-scale",
        type=float,
        default=None,
        help="emulated edge device: profiled load time x this (default 10)",
    )
    parser.add_argument(
        "--malformed-fraction",
        type=float,
        default=0.0,
        help="fault injection: share of requests spoilt (NaN feature, wrong length, unknown "
        "application); each is rejected by name and the rest runs (default 0)",
    )
    parser.add_argument("--k", type=int, default=5, help="SneakPeek neighbours (default 5)")
    parser.add_argument("--index", default="flat", help="flat, ivf or hnsw (default flat)")
    parser.add_argument(
        "--prior", default=None, help="jeffreys, weak or strong (default: each application's)"
    )
    parser.add_argument(
        "--tau",
        type=int,
        default=None,
        help="grouped schedulers: most groups searched exactly (default: the scheduler's, 5)",
    )
    parser.add_argument(
        "--heterogeneity",
        type=float,
        default=1.0,
        help="spread the variants' latencies: x h^r, r in [-1, 1] from fastest to slowest, "
        "geometric mean kept (default 1: as profiled)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="workload seeds (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="first workload seed (default 0)")
    parser.add_argument(
        "--sweep",
        default=None,
        metavar="NAME",
        help=f"vary one setting: {', '.join(SWEEPS)}",
    )
    parser.add_argument(
        "--values",
        default=None,
        metavar="V1,V2,...",
        help="the sweep's values (default per sweep, e.g. deadline 0.05,0.1,0.15,0.2,0.3)",
    )
    registry_arguments(parser)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write runs here")
    parser.add_argument(
        "--report", type=Path, default=None, metavar="DIR", help="write PNG charts and index.html"
    )


def registry_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry",
        type=Path,
        default=None,
        metavar="PATH",
        help="a registry file (default: build the bundled one once into the cache)",
    )
    parser.add_argument(
        "--train-seed",
        type=int,
        default=0,
        help="training seed of the cached bundled registry (default 0)",
    )


def _names(text: str | None, known: Sequence[str], all_text: str) -> tuple[str, ...]:
    chosen = all_text if text is None else text
    names = tuple(part.strip() for part in chosen.split(",") if part.strip())
    if not names:
        raise BadInputError("--schedulers: expected a comma-separated list of scheduler names")
    for name in names:
        if name not in known:
            raise BadInputError(
                f"--schedulers: unknown scheduler {name!r}; known: {', '.join(known) or 'none'}"
            )
    if len(set(names)) != len(names):
        raise BadInputError("--schedulers: a scheduler is named twice")
    return names


def _config(args: argparse.Namespace, seed: int) -> Any:
    from switchyard.selection.views import DEFAULT_LATENCY_SCALE, DEFAULT_LOAD_SCALE

    from research.window.config import WindowSimConfig

    if args.seeds < 1:
        raise BadInputError(f"--seeds: must be >= 1, got {args.seeds}")
    heterogeneity = getattr(args, "heterogeneity", 1.0)
    if not (math.isfinite(heterogeneity) and heterogeneity > 0.0):
        raise BadInputError(f"--heterogeneity: must be a finite number > 0, got {heterogeneity}")
    defaults = WindowSimConfig()
    try:
        return WindowSimConfig(
            window_s=_or(args.window_s, defaults.window_s),
            requests_per_window=_or(args.requests_per_window, defaults.requests_per_window),
            apps=args.apps,
            windows=args.windows,
            deadline_s=_or(args.deadline_s, defaults.deadline_s),
            deadline_std_s=args.deadline_std_s,
            penalty=args.penalty,
            workers=_or(args.workers, defaults.workers),
            latency_scale=(
                DEFAULT_LATENCY_SCALE if args.latency_scale is None else args.latency_scale
            ),
            load_scale=DEFAULT_LOAD_SCALE if args.load_scale is None else args.load_scale,
            k=args.k,
            index=args.index,
            prior=args.prior,
            seed=seed,
            malformed_fraction=args.malformed_fraction,
        )
    except ValueError as exc:
        field, _, message = str(exc).partition(": ")
        raise BadInputError(f"--{field.replace('_', '-')}: {message}") from None


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def with_regime(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--regime``'s settings filled in where no flag set them."""
    name = getattr(args, "regime", None)
    if name is None:
        return args
    merged = argparse.Namespace(**vars(args))
    for key, value in regime_named(name).settings.items():
        if getattr(merged, key, None) is None:
            setattr(merged, key, value)
    return merged


def fail(command: str, exc: BaseException) -> int:
    message = " ".join(str(exc).split())
    print(f"switchyard {command}: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run(
    args: argparse.Namespace,
    *,
    schedulers: Mapping[str, SchedulerFactory] | None = None,
) -> int:
    """``switchyard window``; returns the exit status (2 after one line on bad input).

    ``schedulers`` (name -> factory) replaces the registered schedulers (tests).
    """
    try:
        return _run(args, schedulers)
    except (ValueError, OSError, KeyError) as exc:
        return fail("window", exc)


def _sweep(args: argparse.Namespace) -> tuple[Sweep | None, tuple[SweepValue | None, ...]]:
    name = getattr(args, "sweep", None)
    text = getattr(args, "values", None)
    if name is None:
        if text is not None:
            raise BadInputError("--values: needs --sweep NAME")
        return None, (None,)
    sweep = sweep_named(name)
    return sweep, parse_values(sweep, text)


def _run(args: argparse.Namespace, schedulers: Mapping[str, SchedulerFactory] | None) -> int:
    from research.window.simulator import WindowSimulator
    from research.window.sweep import spread_registry

    if schedulers is None:
        if args.tau is not None and args.tau < 0:
            raise BadInputError(f"--tau: must be >= 0, got {args.tau}")
        factories, all_text = _default_factories(args.tau)
    else:
        factories, all_text = schedulers, ",".join(schedulers)
    names = _names(args.schedulers, tuple(factories), all_text)
    args = with_regime(args)
    sweep, values = _sweep(args)
    # Every value's configuration is checked before anything runs.
    cases: list[tuple[SweepValue | None, argparse.Namespace, Any]] = []
    for value in values:
        case = argparse.Namespace(**vars(args))
        if sweep is not None:
            setattr(case, sweep.field, value)
        cases.append((value, case, _config(case, case.seed)))
    seeds = list(range(args.seed, args.seed + args.seeds))
    registry, registry_dir = resolve_registry(args.registry, args.train_seed)
    runs: list[dict[str, Any]] = []
    app_names: list[str] = []
    for value, case, config in cases:
        heterogeneity = float(getattr(case, "heterogeneity", 1.0))
        simulator = WindowSimulator(spread_registry(registry, heterogeneity), registry_dir, config)
        settings = config.to_dict()
        settings.pop("seed")
        settings["tau"] = getattr(case, "tau", None)
        settings["apps"] = len(simulator.app_names)
        settings["heterogeneity"] = heterogeneity
        app_names = max(app_names, list(simulator.app_names), key=len)
        for name in names:
            for seed in seeds:
                result = simulator.run(factories[name](), seed)
                runs.append(
                    {
                        **result.metrics(),
                        "scheduler": name,
                        **settings,
                        "sweep": None if sweep is None else sweep.name,
                        "value": value,
                    }
                )
    base = cases[0][2]
    base_settings = base.to_dict()
    base_settings.pop("seed")
    base_settings["tau"] = getattr(args, "tau", None)
    base_settings["apps"] = runs[0]["apps"]
    base_settings["heterogeneity"] = runs[0]["heterogeneity"]
    if sweep is not None:
        base_settings[sweep.field] = None  # varies: see "sweep"
    document = {
        "config": {
            **base_settings,
            "sweep": (
                None
                if sweep is None
                else {"name": sweep.name, "field": sweep.field, "values": list(values)}
            ),
            "app_names": app_names,
            "schedulers": list(names),
            "seeds": seeds,
            "registry": str(args.registry) if args.registry else str(registry_dir),
            "regime": getattr(args, "regime", None),
            "emulation": _emulation(base.latency_scale, base.load_scale),
        },
        "runs": runs,
    }
    rows = _aggregate(runs, names, values)
    table = format_sweep_table(rows, sweep)
    if args.regime is not None:
        regime = regime_named(args.regime)
        changed = [
            f"--{key.replace('_', '-')} {'swept' if sweep and sweep.field == key else value}"
            for key, wanted in regime.settings.items()
            if (value := getattr(args, key)) != wanted or (sweep and sweep.field == key)
        ]
        besides = f" (besides it: {', '.join(changed)})" if changed else ""
        print(f"regime {args.regime}: {regime.summary}{besides}")
    if sweep is None or sweep.field not in ("latency_scale", "load_scale"):
        print(_emulation(base.latency_scale, base.load_scale))
    print(table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
        print(f"runs written to {args.json}", file=sys.stderr)
    if args.report is not None:
        page = write_report(rows, document, args.report, sweep=sweep, table=table)
        print(f"report written to {page}", file=sys.stderr)
    return 0


def _emulation(latency_scale: float, load_scale: float) -> str:
    return (
        f"emulated edge device: profiled CPU batch latencies x{latency_scale:g}, "
        f"load times x{load_scale:g} (virtual time)"
    )


# (key, header, format, scale): a column shows ``format.format(value * scale)``; times
# are seconds in the runs and milliseconds on screen.
_COLUMNS: tuple[tuple[str, str, str, float], ...] = (
    ("utility", "utility", "{:.3f}", 1.0),
    ("accuracy", "accuracy", "{:.3f}", 1.0),
    ("deadline_violation_rate", "violations %", "{:.1%}", 1.0),
    ("mean_violation_s", "mean viol ms", "{:.1f}", 1e3),
    ("sched_overhead_p50_s", "ovh P50 ms", "{:.3f}", 1e3),
    ("sched_overhead_p99_s", "ovh P99 ms", "{:.3f}", 1e3),
    ("short_circuited", "short-circ", "{:.1f}", 1.0),
    ("rejected", "rejected", "{:.1f}", 1.0),
)


def _aggregate(
    runs: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    values: Sequence[SweepValue | None] = (None,),
) -> list[dict[str, Any]]:
    """One row per (swept value, scheduler): each column's mean, min and max over seeds."""
    rows = []
    for value in values:
        for name in names:
            mine = [r for r in runs if r["scheduler"] == name and r.get("value") == value]
            row: dict[str, Any] = {"scheduler": name, "value": value, "seeds": len(mine)}
            for key, _, _, _ in _COLUMNS:
                column = [float(r[key]) for r in mine]
                row[key] = statistics.fmean(column)
                row[f"{key}_min"] = min(column)
                row[f"{key}_max"] = max(column)
            rows.append(row)
    return rows


def format_sweep_table(rows: Sequence[Mapping[str, Any]], sweep: Sweep | None) -> str:
    """:func:`format_table`, in one block per swept value headed ``name = value``."""
    if sweep is None:
        return format_table(rows)
    blocks = []
    for value in dict.fromkeys(row["value"] for row in rows):
        block = [row for row in rows if row["value"] == value]
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        blocks.append(f"{sweep.name} = {shown} ({sweep.label})\n{format_table(block)}")
    return "\n\n".join(blocks)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per scheduler: the means over seeds (violations as a percentage)."""
    header = ["scheduler", *(title for _, title, _, _ in _COLUMNS)]
    body = [
        [str(row["scheduler"]), *(fmt.format(row[key] * scale) for key, _, fmt, scale in _COLUMNS)]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = []
    for line in [header, *body]:
        cells = [
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
            for i, cell in enumerate(line)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def write_report(
    rows: Sequence[Mapping[str, Any]],
    document: Mapping[str, Any],
    out_dir: Path,
    *,
    sweep: Sweep | None = None,
    table: str | None = None,
) -> Path:
    """The charts and ``index.html`` (:func:`research.window.plots.write_report`)."""
    from research.window.plots import write_report as draw

    shown = format_sweep_table(rows, sweep) if table is None else table
    return draw(rows, document, out_dir, table=shown, sweep=sweep)
