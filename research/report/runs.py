"""Run records of ``switchyard simulate``: their shape, checked on reading and written as
strict JSON.

A *run* is one simulation of one policy on one scenario with one seed, as a JSON-ready
``dict``. Its keys:

==========================  ====================================================
``policy``                  policy name (``str``)
``workers``                 cluster size (``int``)
``seed``                    random seed (``int``)
``trace``                   trace name, e.g. ``azure-conv`` (``str``)
``load_scale``              arrival-rate multiplier (``float``)
``predictor_error``         injected predictor error, 0.2 = 20 % (``float``)
``gpu``                     GPU/model profile, e.g. ``a100-80gb/llama-2-7b`` (``str``)
``slo_scale``               SLO as a multiple of the request's service time (``float``)
``requests``, ``completed`` request counts (``int``)
``p50_s`` ``p90_s`` ``p99_s``  latency percentiles in seconds (``float``)
``slo_violation_rate``      fraction of requests over their end-to-end objective
                            (or rejected, or refused by admission), 0..1
``ttft_p99_s`` ``tpot_p99_s``  optional: P99 time to first token and per output token
``slo_attainment``          optional: fraction of requests that met every objective
                            (TTFT, TPOT, end to end; :mod:`switchyard.slo`), 0..1
``goodput_rps``             optional: those requests per simulated second
``refused``                 optional: requests the policy's admission refused (``int``)
``migrations``              migrations carried out (``int``)
``migration_cost_s``        seconds spent moving requests (``float``)
``mean_utilization``        mean busy fraction of the workers, 0..1
``load_cov``                coefficient of variation of worker load (``float``)
``throughput_rps``          completed requests per simulated second (``float``)
``sim_wall_s``              wall-clock seconds the simulation took (``float``)
``latency_quantiles_s``     optional: the 0th..100th latency percentiles (101 floats)
``reference``               optional, default false: a reference (the clairvoyant
                            oracle), not a contender; never named "best"
==========================  ====================================================

A metric may be ``None`` (written for NaN, which JSON cannot hold: a run that completed
no request has no percentile); it reads back as NaN and prints as ``n/a``.

Runs that differ only in their seed form a *group*; groups that differ only in their
policy form a *scenario* (:mod:`research.report.table` averages and compares them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from switchyard.figures import ReportError

Run = dict[str, Any]
"""One simulation run, JSON-ready (see the module docstring for its keys)."""

AggregateRow = dict[str, Any]
"""One group of runs averaged over seeds (see :func:`aggregate`)."""


SCENARIO_KEYS: tuple[str, ...] = ("trace", "gpu", "workers", "load_scale", "predictor_error")
"""What defines a scenario: every group key but the policy."""

GROUP_KEYS: tuple[str, ...] = ("policy", *SCENARIO_KEYS)
"""What defines a group: runs with equal values here differ only in their seed."""

METRIC_KEYS: tuple[str, ...] = (
    "requests",
    "completed",
    "p50_s",
    "p90_s",
    "p99_s",
    "slo_violation_rate",
    "migrations",
    "migration_cost_s",
    "mean_utilization",
    "load_cov",
    "throughput_rps",
    "sim_wall_s",
)
"""Numeric results averaged over seeds."""

OPTIONAL_METRIC_KEYS: tuple[str, ...] = (
    "ttft_p99_s",
    "tpot_p99_s",
    "slo_attainment",
    "goodput_rps",
    "refused",
)
"""Numeric results that runs written before they existed lack (aggregated as NaN)."""

SPREAD_KEYS: tuple[str, ...] = ("p99_s", "slo_violation_rate")
"""Metrics whose spread over seeds is kept: ``{key}_min``, ``{key}_max``, ``{key}_std``."""

REQUIRED_KEYS: tuple[str, ...] = (*GROUP_KEYS, "seed", "slo_scale", *METRIC_KEYS)
"""Keys every run must have; ``reference`` and ``latency_quantiles_s`` are optional."""

_STR_KEYS = frozenset({"policy", "trace", "gpu"})
_INT_KEYS = frozenset({"workers", "seed"})


def check_runs(runs: Iterable[object]) -> list[Run]:
    """Validate run records and return normalised copies.

    Normalising: ``reference`` defaults to false, a ``None`` metric becomes NaN, numbers
    become ``float`` (identity fields ``workers`` and ``seed`` stay ``int``).

    Raises:
        ReportError: naming each bad run (by index, policy and seed) and what is wrong.

    Example: ``check_runs([{"policy": "jsq"}])`` raises ``ReportError("malformed
    simulation runs: run 0 (policy 'jsq', seed ?): missing keys trace, gpu, ...")``.
    """
    checked: list[Run] = []
    problems: list[str] = []
    for index, raw in enumerate(runs):
        if not isinstance(raw, Mapping):
            problems.append(f"run {index}: expected an object, got {type(raw).__name__}")
            continue
        name = f"run {index} (policy {raw.get('policy', '?')!r}, seed {raw.get('seed', '?')})"
        missing = [key for key in REQUIRED_KEYS if key not in raw]
        if missing:
            problems.append(f"{name}: missing keys {', '.join(missing)}")
            continue
        run: Run = dict(raw)
        bad: list[str] = []
        for key in REQUIRED_KEYS:
            value = raw[key]
            if key in _STR_KEYS:
                if not isinstance(value, str):
                    bad.append(f"{key} should be a string, got {value!r}")
            elif key in _INT_KEYS:
                if isinstance(value, bool) or not isinstance(value, int):
                    bad.append(f"{key} should be an integer, got {value!r}")
            else:
                run[key] = _number(key, value, bad)
        for key in OPTIONAL_METRIC_KEYS:
            if key in raw:
                run[key] = _number(key, raw[key], bad)
        run["reference"] = bool(raw.get("reference", False))
        quantiles = raw.get("latency_quantiles_s")
        if quantiles is not None:
            if not isinstance(quantiles, list | tuple) or not all(
                q is None or (isinstance(q, int | float) and not isinstance(q, bool))
                for q in quantiles
            ):
                bad.append("latency_quantiles_s should be a list of numbers")
            else:
                run["latency_quantiles_s"] = [
                    math.nan if q is None else float(q) for q in quantiles
                ]
        if bad:
            problems.append(f"{name}: {'; '.join(bad)}")
            continue
        checked.append(run)
    if problems:
        shown = problems[:10]
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise ReportError("malformed simulation runs:\n  " + "\n  ".join(shown) + more)
    return checked


def _number(key: str, value: object, bad: list[str]) -> float:
    """A metric as a float: None reads as NaN; anything else not a number is noted."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        bad.append(f"{key} should be a number, got {value!r}")
        return math.nan
    return float(value)


def json_ready(value: Any) -> Any:
    # JSON has no NaN or infinity; null is what readers of runs.json can handle.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def runs_to_json(runs: Sequence[Mapping[str, Any]]) -> str:
    """The runs as strict JSON text (a list of objects; NaN and infinity become ``null``).

    Example:
        >>> runs_to_json([{"policy": "jsq", "p99_s": float("nan")}])
        '[\\n  {\\n    "policy": "jsq",\\n    "p99_s": null\\n  }\\n]\\n'
    """
    return json.dumps(json_ready(list(runs)), indent=2, allow_nan=False) + "\n"


def write_runs_json(runs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Write :func:`runs_to_json` to ``path`` (its folder must exist); return ``path``."""
    try:
        path.write_text(runs_to_json(runs), encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def load_runs(path: Path) -> list[Run]:
    """Read runs written by :func:`write_runs_json` (or ``{"runs": [...]}``) and check them.

    Raises:
        ReportError: the file cannot be read, is not JSON, or holds malformed runs.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path} is not JSON: {exc}") from exc
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    if not isinstance(data, list):
        raise ReportError(f"{path} should hold a list of runs")
    return check_runs(data)
