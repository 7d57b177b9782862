"""``switchyard window`` and ``switchyard estimates``: output and bad input.

A small registry (one application, two variants; built in well under a second) and a
scheduler defined here keep these tests independent of the real schedulers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from switchyard.apps.profiling import build_registry
from switchyard.apps.registry_file import REGISTRY_FILE, save_registry

from research.window.command import EXIT_BAD_INPUT, add_arguments, run
from research.window.estimates_command import add_accuracy_arguments, run_accuracy
from tests.unit.window_schedulers import MostAccurate

SCHEDULERS = {"test-most-accurate": MostAccurate}


def build_small_registry(out: Path) -> Path:
    """One application (wine-dominant), two variants, built into ``out``; its file."""
    registry = build_registry(
        out,
        seed=0,
        repeats=3,
        applications=("wine-dominant",),
        variants=("logreg-pca4", "mlp-small"),
    )
    save_registry(registry, out / REGISTRY_FILE)
    return out / REGISTRY_FILE


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_registry(tmp_path_factory.mktemp("small-apps"))


def _args(argv: list[str], accuracy: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    (add_accuracy_arguments if accuracy else add_arguments)(parser)
    return parser.parse_args(argv)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_an_unknown_scheduler_is_one_line_listing_the_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = run(_args(["--schedulers", "test-most-accurate,nope"]), schedulers=SCHEDULERS)
    assert code == EXIT_BAD_INPUT
    err = _one_line(capsys)
    assert "unknown scheduler 'nope'" in err
    assert "test-most-accurate" in err


def test_an_unknown_registered_scheduler_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args(["--schedulers", "no-such-scheduler"])) == EXIT_BAD_INPUT
    assert "unknown scheduler 'no-such-scheduler'" in _one_line(capsys)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--requests-per-window", "0"], "--requests-per-window"),
        (["--requests-per-window", "-4"], "--requests-per-window"),
        (["--deadline-s", "nan"], "--deadline-s"),
        (["--deadline-std-s", "-1"], "--deadline-std-s"),
        (["--workers", "0"], "--workers"),
        (["--penalty", "cubic"], "--penalty"),
        (["--latency-scale", "0"], "--latency-scale"),
        (["--seeds", "0"], "--seeds"),
    ],
)
def test_a_bad_number_or_kind_is_one_line_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_args(argv), schedulers=SCHEDULERS) == EXIT_BAD_INPUT
    assert named in _one_line(capsys)


def test_a_bad_registry_file_is_one_line_naming_the_field(
    registry_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(registry_file.read_text())
    data["applications"][0]["variants"]["mlp-small"]["accuracy"] = 1.5
    bad = tmp_path / "registry.json"
    bad.write_text(json.dumps(data))
    argv = ["--registry", str(bad), "--windows", "2", "--seeds", "1"]
    assert run(_args(argv), schedulers=SCHEDULERS) == EXIT_BAD_INPUT
    assert "applications[0].variants.mlp-small.accuracy" in _one_line(capsys)
    assert run_accuracy(_args(["--registry", str(bad)], accuracy=True)) == EXIT_BAD_INPUT
    assert "applications[0].variants.mlp-small.accuracy" in _one_line(capsys)
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert run(_args(["--registry", str(empty)]), schedulers=SCHEDULERS) == EXIT_BAD_INPUT
    assert "empty" in _one_line(capsys)


def test_the_table_and_json_hold_every_scheduler_and_seed(
    registry_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.json"
    argv = ["--registry", str(registry_file), "--windows", "5", "--seeds", "2", "--json", str(out)]
    assert run(_args(argv), schedulers=SCHEDULERS) == 0
    printed = capsys.readouterr().out
    assert "emulated edge device" in printed
    assert "test-most-accurate" in printed
    document = json.loads(out.read_text())
    assert document["config"]["schedulers"] == ["test-most-accurate"]
    assert document["config"]["latency_scale"] == 100.0
    assert [r["seed"] for r in document["runs"]] == [0, 1]
    required = {
        "scheduler", "seed", "utility", "accuracy", "deadline_violation_rate",
        "mean_violation_s", "sched_overhead_p50_s", "sched_overhead_p99_s",
        "requests_per_window", "deadline_s", "workers", "latency_scale", "penalty",
    }  # fmt: skip
    for entry in document["runs"]:
        assert required <= entry.keys()
        assert entry["requests"] == 5 * 12


def test_the_report_has_bar_charts_and_a_page(
    registry_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report"
    argv = ["--registry", str(registry_file), "--windows", "3", "--seeds", "1"]
    assert run(_args([*argv, "--report", str(report)]), schedulers=SCHEDULERS) == 0
    assert (report / "utility.png").stat().st_size > 0
    assert (report / "accuracy.png").stat().st_size > 0
    page = (report / "index.html").read_text()
    assert "utility.png" in page
    assert "emulated edge device" in page


def test_the_accuracy_command_covers_every_index_k_and_prior(
    registry_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "accuracy.json"
    argv = ["--registry", str(registry_file), "--requests", "300", "--json", str(out)]
    assert run_accuracy(_args(argv, accuracy=True)) == 0
    assert "SneakPeek MAE" in capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    keys = {(r["variant"], r["index"], r["k"], r["prior"]) for r in results}
    assert len(results) == len(keys) == 2 * 3 * 2 * 5
    assert {r["prior"] for r in results} == {
        "jeffreys",
        "weak",
        "strong",
        "strong-stream",
        "mismatched",
    }
    for row in results:
        assert 0.0 <= row["sneakpeek_mae"] <= 1.0
        assert row["requests"] == 300
    assert run_accuracy(_args(["--requests", "0"], accuracy=True)) == EXIT_BAD_INPUT
    assert "--requests" in _one_line(capsys)
