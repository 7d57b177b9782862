"""``switchyard window --regime NAME``: named configurations, what they set and what wins.

The ``paper`` regime is where SneakPeek's grouped scheduling is meant to pay: model
swap-ins cost as much relative to inference as on the profiling CPU, so the
request-by-request baselines, which swap on nearly every request, fall behind.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from switchyard.apps.profiling import build_registry
from switchyard.apps.registry_file import REGISTRY_FILE, save_registry

from research.window.command import EXIT_BAD_INPUT, add_arguments, run
from research.window.regimes import REGIMES
from tests.unit.test_window_command import build_small_registry
from tests.unit.window_schedulers import MostAccurate

SCHEDULERS = {"test-most-accurate": MostAccurate}


@pytest.fixture(scope="module")
def small_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_registry(tmp_path_factory.mktemp("small-apps"))


@pytest.fixture(scope="module")
def bundled_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundled-apps")
    save_registry(build_registry(out, seed=0, repeats=3), out / REGISTRY_FILE)
    return out / REGISTRY_FILE


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _config(registry: Path, tmp_path: Path, argv: list[str]) -> dict[str, object]:
    out = tmp_path / "runs.json"
    common = ["--registry", str(registry), "--windows", "2", "--seeds", "1", "--json", str(out)]
    assert run(_args([*common, *argv]), schedulers=SCHEDULERS) == 0
    config: dict[str, object] = json.loads(out.read_text())["config"]
    return config


def test_the_paper_regime_sets_the_device_deadline_and_penalty(
    small_registry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(small_registry, tmp_path, ["--regime", "paper"])
    assert config["regime"] == "paper"
    assert (config["latency_scale"], config["load_scale"]) == (200.0, 200.0)
    assert (config["deadline_s"], config["window_s"], config["penalty"]) == (0.15, 0.1, "sigmoid")
    printed = capsys.readouterr().out
    assert "regime paper:" in printed
    assert "latencies x200, load times x200" in printed


def test_a_flag_or_a_sweep_value_wins_over_the_regime(
    small_registry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(small_registry, tmp_path, ["--regime", "paper", "--load-scale", "50"])
    assert (config["latency_scale"], config["load_scale"]) == (200.0, 50.0)
    assert "(besides it: --load-scale 50.0)" in capsys.readouterr().out
    out = tmp_path / "sweep.json"
    argv = [
        *("--registry", str(small_registry), "--windows", "2", "--seeds", "1"),
        *("--regime", "paper", "--sweep", "load-scale", "--values", "10,20"),
        *("--json", str(out)),
    ]
    assert run(_args(argv), schedulers=SCHEDULERS) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["load_scale"], r["latency_scale"]) for r in runs] == [(10.0, 200.0), (20.0, 200.0)]


def test_without_a_regime_the_defaults_hold(small_registry: Path, tmp_path: Path) -> None:
    config = _config(small_registry, tmp_path, [])
    assert config["regime"] is None
    assert (config["latency_scale"], config["load_scale"], config["penalty"]) == (100.0, 10.0, None)
    assert (config["deadline_s"], config["requests_per_window"], config["workers"]) == (0.15, 12, 1)


def test_an_unknown_regime_is_one_line_listing_the_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(_args(["--regime", "laptop"]), schedulers=SCHEDULERS) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--regime: unknown regime 'laptop'" in err
    assert all(name in err for name in REGIMES)


def test_in_the_paper_regime_sneakpeek_earns_twice_lo_edfs_utility(
    bundled_registry: Path, tmp_path: Path
) -> None:
    out = tmp_path / "paper.json"
    argv = [
        *("--registry", str(bundled_registry), "--regime", "paper"),
        *("--schedulers", "lo-edf,sneakpeek", "--windows", "20", "--seeds", "1"),
        *("--json", str(out)),
    ]
    assert run(_args(argv)) == 0
    utility = {r["scheduler"]: r["utility"] for r in json.loads(out.read_text())["runs"]}
    assert utility["sneakpeek"] >= 2.0 * utility["lo-edf"], utility
    # and not by dropping the baseline to nothing on a device that cannot keep up at all:
    assert utility["sneakpeek"] > 0.8, utility
