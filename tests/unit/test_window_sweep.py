"""``switchyard window --sweep``: runs per value, charts, bad input, and the
model-variant heterogeneity transform."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from switchyard.apps.penalty import Penalty
from switchyard.apps.registry_file import load_registry
from switchyard.selection.registry import make_window_scheduler
from switchyard.selection.snapshot import AppView, VariantView
from switchyard.selection.views import app_view

from research.window.command import EXIT_BAD_INPUT, add_arguments, run
from research.window.sweep import (
    SWEEPS,
    heterogeneity_factors,
    parse_values,
    spread_registry,
    spread_view,
)
from tests.unit.test_window_command import build_small_registry
from tests.unit.window_schedulers import MostAccurate

SCHEDULERS = {"test-most-accurate": MostAccurate, "lo-edf": lambda: make_window_scheduler("lo-edf")}


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_registry(tmp_path_factory.mktemp("small-apps-sweep"))


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_sweep_runs_every_scheduler_at_every_value_and_draws_the_charts(
    registry_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "runs.json", tmp_path / "report"
    argv = ["--registry", str(registry_file), "--windows", "3", "--seeds", "1"]
    argv += ["--sweep", "deadline", "--values", "0.05,0.3", "--json", str(out)]
    assert run(_args([*argv, "--report", str(report)]), schedulers=SCHEDULERS) == 0
    printed = capsys.readouterr().out
    assert "deadline = 0.05 (" in printed
    assert "deadline = 0.3 (" in printed
    document = json.loads(out.read_text())
    assert document["config"]["sweep"] == {
        "name": "deadline",
        "field": "deadline_s",
        "values": [0.05, 0.3],
    }
    runs = document["runs"]
    assert [(r["value"], r["scheduler"]) for r in runs] == [
        (0.05, "test-most-accurate"),
        (0.05, "lo-edf"),
        (0.3, "test-most-accurate"),
        (0.3, "lo-edf"),
    ]
    for entry in runs:
        assert entry["sweep"] == "deadline"
        assert entry["deadline_s"] == entry["value"]
    for name in ("utility", "accuracy", "utility_vs_deadline", "violations_vs_deadline"):
        assert (report / f"{name}.png").stat().st_size > 0
        assert f"{name}.png" in (report / "index.html").read_text()


def test_a_heterogeneity_sweep_records_h_on_each_run(
    registry_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.json"
    argv = ["--registry", str(registry_file), "--windows", "2", "--seeds", "1"]
    argv += ["--sweep", "heterogeneity", "--values", "1,4", "--json", str(out)]
    argv += ["--schedulers", "test-most-accurate"]
    assert run(_args(argv), schedulers=SCHEDULERS) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["heterogeneity"], r["value"]) for r in runs] == [(1.0, 1.0), (4.0, 4.0)]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--sweep", "moon-phase"], "--sweep: unknown sweep 'moon-phase'"),
        (["--sweep", "deadline", "--values", "0.05,abc"], "--values"),
        (["--sweep", "deadline", "--values", "0,0.05"], "--values"),
        (["--sweep", "deadline", "--values", "0.05,,0.1"], "--values"),
        (["--sweep", "deadline", "--values", "0.05,0.05"], "--values"),
        (["--sweep", "apps", "--values", "1.5"], "--values"),
        (["--sweep", "penalty", "--values", "step,cubic"], "--values: unknown penalty"),
        (["--sweep", "heterogeneity", "--values", "0"], "--values"),
        (["--values", "1,2"], "--values: needs --sweep"),
        (["--heterogeneity", "-1"], "--heterogeneity"),
    ],
)
def test_a_bad_sweep_or_value_is_one_line(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_args(argv), schedulers=SCHEDULERS) == EXIT_BAD_INPUT
    assert named in _one_line(capsys)


def test_every_sweep_parses_its_defaults() -> None:
    assert parse_values(SWEEPS["deadline"], None) == (0.05, 0.1, 0.15, 0.2, 0.3)
    assert parse_values(SWEEPS["apps"], None) == (1, 2, 3, 4, 6)
    assert parse_values(SWEEPS["penalty"], None) == ("step", "linear", "sigmoid")
    for sweep in SWEEPS.values():
        assert len(parse_values(sweep, None)) >= 3


def _variant(name: str, batch1_s: float, batch8_s: float) -> VariantView:
    return VariantView(
        name=name,
        latency_s={"cpu": {1: batch1_s, 8: batch8_s}},
        load_s=0.003,
        accuracy=0.9,
        recall=(0.9,),
    )


def _gmean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


@pytest.mark.parametrize("h", [1.0, 1.5, 2.0, 4.0])
def test_heterogeneity_keeps_the_geometric_mean_and_orders_the_variants(h: float) -> None:
    view = AppView(
        name="a",
        num_classes=1,
        penalty=Penalty(kind="step"),
        variants=(
            _variant("big", 0.008, 0.020),
            _variant("tiny", 0.001, 0.002),
            _variant("mid", 0.003, 0.006),
        ),
    )
    spread = spread_view(view, h)
    assert [v.name for v in spread.variants] == ["big", "tiny", "mid"]
    for size in (1, 8):
        before = [v.latency_s["cpu"][size] for v in view.variants]
        after = [v.latency_s["cpu"][size] for v in spread.variants]
        assert _gmean(after) == pytest.approx(_gmean(before))
        order = sorted(range(3), key=lambda i: before[i])
        assert sorted(range(3), key=lambda i: after[i]) == order
    by_name = {v.name: v for v in spread.variants}
    assert by_name["tiny"].latency_s["cpu"][1] == pytest.approx(0.001 / h)
    assert by_name["mid"].latency_s["cpu"][8] == pytest.approx(0.006)
    assert by_name["big"].latency_s["cpu"][8] == pytest.approx(0.020 * h)
    assert by_name["big"].load_s == 0.003
    assert heterogeneity_factors({"x": {"cpu": {1: 0.005}}}, h) == {"x": 1.0}


def test_heterogeneity_below_one_narrows_and_bad_h_is_refused() -> None:
    factors = heterogeneity_factors({"a": {"cpu": {1: 0.001}}, "b": {"cpu": {1: 0.009}}}, 0.5)
    assert factors == {"a": pytest.approx(2.0), "b": pytest.approx(0.5)}
    with pytest.raises(ValueError, match="heterogeneity"):
        heterogeneity_factors({"a": {"cpu": {1: 0.001}}}, 0.0)


def test_the_registry_transform_matches_the_view_transform(registry_file: Path) -> None:
    registry = load_registry(registry_file)
    assert spread_registry(registry, 1.0) is registry
    spread = spread_registry(registry, 3.0)
    for original, changed in zip(registry.applications, spread.applications, strict=True):
        expected = spread_view(app_view(original, latency_scale=100.0), 3.0)
        got = app_view(changed, latency_scale=100.0)
        for e, g in zip(expected.variants, got.variants, strict=True):
            for worker_type, by_size in e.latency_s.items():
                for size, ms in by_size.items():
                    assert g.latency_s[worker_type][size] == pytest.approx(ms)
