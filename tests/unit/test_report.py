"""Reports of `switchyard simulate`: aggregation, tables, plots and the HTML page."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from research.report import (
    ReportError,
    aggregate,
    check_runs,
    format_markdown_table,
    format_table,
    load_runs,
    runs_to_json,
    write_plots,
    write_report,
    write_runs_json,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GPU = "a100-80gb/llama-2-7b"

# Mean P99 per policy at 8 workers (seed offsets average out to zero); the oracle is
# fastest but is a reference, so gaps must be named best, 1.5x ahead of jsq.
P99_S = {"gaps": 2.0, "jsq": 3.0, "round-robin": 5.0, "oracle": 1.0}


def make_run(
    policy: str,
    *,
    seed: int = 0,
    workers: int = 8,
    load_scale: float = 1.0,
    predictor_error: float = 0.0,
    trace: str = "azure-conv",
    p99_s: float | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    # Smaller clusters are slower; seeds scatter around the mean by -0.1, 0, +0.1.
    p99 = p99_s if p99_s is not None else P99_S.get(policy, 4.0) * 8 / workers + 0.1 * (seed - 1)
    run: dict[str, Any] = {
        "policy": policy,
        "workers": workers,
        "seed": seed,
        "trace": trace,
        "load_scale": load_scale,
        "predictor_error": predictor_error,
        "gpu": GPU,
        "slo_scale": 5.0,
        "requests": 1000,
        "completed": 1000,
        "p50_s": p99 / 4,
        "p90_s": p99 / 2,
        "p99_s": p99,
        "slo_violation_rate": p99 / 100,
        "migrations": 10 if policy == "gaps" else 0,
        "migration_cost_s": 0.5 if policy == "gaps" else 0.0,
        "mean_utilization": 0.6,
        "load_cov": 0.2,
        "throughput_rps": 12.5,
        "sim_wall_s": 0.8,
        "latency_quantiles_s": [p99 * (i + 1) / 101 for i in range(101)],
        "reference": policy == "oracle",
    }
    run.update(overrides)
    return run


@pytest.fixture
def sweep_runs() -> list[dict[str, Any]]:
    """Four policies, cluster sizes 4 and 8, three seeds each."""
    return [
        make_run(policy, seed=seed, workers=workers)
        for workers in (4, 8)
        for policy in ("gaps", "jsq", "round-robin", "oracle")
        for seed in (0, 1, 2)
    ]


def _rows_of(table: str) -> list[str]:
    return table.splitlines()


# --------------------------------------------------------------------- aggregation


def test_aggregate_averages_each_metric_over_seeds() -> None:
    runs = [
        make_run("gaps", seed=0, p99_s=1.0, migrations=1, mean_utilization=0.5),
        make_run("gaps", seed=1, p99_s=3.0, migrations=2, mean_utilization=0.7),
    ]
    (row,) = aggregate(runs)
    assert row["policy"] == "gaps"
    assert row["seeds"] == [0, 1]
    assert row["n_seeds"] == 2
    assert row["p99_s"] == pytest.approx(2.0)
    assert row["p50_s"] == pytest.approx(0.5)
    assert row["migrations"] == pytest.approx(1.5)
    assert row["mean_utilization"] == pytest.approx(0.6)
    assert row["p99_s_min"] == 1.0
    assert row["p99_s_max"] == 3.0
    assert row["p99_s_std"] == pytest.approx(math.sqrt(2))
    assert row["latency_quantiles_s"][100] == pytest.approx(2.0 * 101 / 101)


def test_aggregate_keeps_one_row_per_group_in_the_input_policy_order(
    sweep_runs: list[dict[str, Any]],
) -> None:
    rows = aggregate(sweep_runs)
    assert [(r["workers"], r["policy"]) for r in rows] == [
        (4, "gaps"),
        (4, "jsq"),
        (4, "round-robin"),
        (4, "oracle"),
        (8, "gaps"),
        (8, "jsq"),
        (8, "round-robin"),
        (8, "oracle"),
    ]
    assert all(r["n_seeds"] == 3 for r in rows)
    assert [r["reference"] for r in rows if r["workers"] == 8] == [False, False, False, True]


def test_aggregate_groups_by_every_scenario_field() -> None:
    runs = [
        make_run("gaps", load_scale=1.0),
        make_run("gaps", load_scale=2.0),
        make_run("gaps", predictor_error=0.2),
        make_run("gaps", trace="azure-code"),
        make_run("gaps", gpu="h100-80gb/llama-2-7b"),
        make_run("gaps", seed=1),
    ]
    rows = aggregate(runs)
    assert len(rows) == 5
    assert rows[0]["n_seeds"] == 2


def test_a_seed_without_a_p99_makes_the_group_unknown_not_optimistic() -> None:
    runs = [make_run("gaps", seed=0, p99_s=1.0), make_run("gaps", seed=1)]
    runs[1]["p99_s"] = None
    (row,) = aggregate(runs)
    assert math.isnan(row["p99_s"])
    assert "n/a" in format_table(runs)


def test_malformed_runs_are_named_with_what_is_wrong() -> None:
    bad = make_run("gaps")
    del bad["p99_s"]
    worse = make_run("jsq")
    worse["workers"] = "eight"
    with pytest.raises(ReportError) as caught:
        check_runs([make_run("oracle"), bad, worse])
    message = str(caught.value)
    assert "run 1 (policy 'gaps', seed 0): missing keys p99_s" in message
    assert "run 2 (policy 'jsq', seed 0): workers should be an integer" in message


def test_runs_json_round_trips_and_writes_nan_as_null(tmp_path: Path) -> None:
    runs = [make_run("gaps"), make_run("jsq", p50_s=math.nan)]
    assert "NaN" not in runs_to_json(runs)
    path = write_runs_json(runs, tmp_path / "runs.json")
    assert json.loads(path.read_text())[1]["p50_s"] is None
    loaded = load_runs(path)
    assert loaded[0] == check_runs(runs)[0]
    assert math.isnan(loaded[1]["p50_s"])


# --------------------------------------------------------------------- tables


def test_table_lists_each_policy_once_per_scenario(sweep_runs: list[dict[str, Any]]) -> None:
    table = format_table(sweep_runs)
    cells = [
        (m[2], m[1])
        for line in _rows_of(table)
        if (m := re.match(r"^(gaps|jsq|round-robin|oracle)(?: \(ref\))?\s+(\d+)\s", line))
    ]
    assert cells == [
        (workers, policy)
        for workers in ("4", "8")
        for policy in ("gaps", "jsq", "round-robin", "oracle")
    ]


def test_table_has_readable_headers_with_units(sweep_runs: list[dict[str, Any]]) -> None:
    header = _rows_of(format_table(sweep_runs))[1]
    for title in (
        "policy",
        "workers",
        "P50 s",
        "P90 s",
        "P99 s",
        "SLO viol %",
        "migrations",
        "mig cost s",
        "util %",
        "load CoV",
        "req/s",
        "sim wall s",
    ):
        assert title in header


def test_table_caption_carries_the_fields_every_row_shares(
    sweep_runs: list[dict[str, Any]],
) -> None:
    caption = _rows_of(format_table(sweep_runs))[0]
    assert caption == f"trace azure-conv, gpu {GPU}, load x1, predictor error 0%, 3 seeds"


def test_table_marks_the_reference(sweep_runs: list[dict[str, Any]]) -> None:
    lines = _rows_of(format_table(sweep_runs))
    assert sum(line.startswith("oracle (ref)") for line in lines) == 2
    assert not any(line.startswith(("gaps (ref)", "jsq (ref)")) for line in lines)


def test_table_names_the_best_contender_by_p99_never_the_reference(
    sweep_runs: list[dict[str, Any]],
) -> None:
    best = [line for line in _rows_of(format_table(sweep_runs)) if line.startswith("best P99")]
    assert best == [
        "best P99 (4 workers): gaps 4.00 s; runner-up jsq 6.00 s is 1.50x slower",
        "best P99 (8 workers): gaps 2.00 s; runner-up jsq 3.00 s is 1.50x slower",
    ]


def test_a_lone_contender_is_best_without_a_ratio() -> None:
    table = format_table([make_run("gaps", seed=1), make_run("oracle", seed=1)])
    assert "best P99: gaps 2.00 s; the only contender" in table


def test_table_columns_line_up(sweep_runs: list[dict[str, Any]]) -> None:
    lines = _rows_of(format_table(sweep_runs))
    header, rule = lines[1], lines[2]
    # Each column's right edge in the rule is where its right-aligned numbers end.
    edges = [m.end() for m in re.finditer(r"-+", rule)]
    for line in lines[3:11]:
        for edge in edges[1:]:
            assert line[edge - 1] != " ", (line, edge)
    assert len(header.rstrip()) <= len(rule)


def test_chosen_columns_and_unknown_ones(sweep_runs: list[dict[str, Any]]) -> None:
    table = format_table(sweep_runs, columns=["policy", "workers", "p99_s"])
    assert _rows_of(table)[1].split() == ["policy", "workers", "P99", "s"]
    with pytest.raises(ReportError, match="unknown table columns p42"):
        format_table(sweep_runs, columns=["policy", "p42"])


def test_markdown_table_is_valid_github_markdown(sweep_runs: list[dict[str, Any]]) -> None:
    text = format_markdown_table(sweep_runs)
    lines = text.splitlines()
    table = [line for line in lines if line.startswith("|")]
    # A caption paragraph, a blank line, then a contiguous table.
    assert lines[0].startswith("trace azure-conv")
    assert lines[1] == ""
    start = lines.index(table[0])
    assert lines[start : start + len(table)] == table
    assert len(table) == 2 + 8
    cells = [len(re.findall(r"(?<!\\)\|", line)) - 1 for line in table]
    assert len(set(cells)) == 1
    assert re.fullmatch(r"\|(?:-{3,}:?\|)+", table[1])
    assert table[0].startswith("| policy | workers | P50 s |")
    assert "| oracle (ref) |" in text
    assert "- best P99 (8 workers): gaps 2.00 s; runner-up jsq 3.00 s is 1.50x slower" in lines


def test_markdown_escapes_a_pipe_in_a_name() -> None:
    text = format_markdown_table([make_run("a|b"), make_run("jsq")])
    assert "| a\\|b |" in text


# --------------------------------------------------------------------- plots


def _png_names(paths: list[Path]) -> list[str]:
    for path in paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    return [path.name for path in paths]


def test_plots_for_a_multi_worker_multi_seed_sweep(
    tmp_path: Path, sweep_runs: list[dict[str, Any]]
) -> None:
    paths = write_plots(sweep_runs, tmp_path / "report")
    assert _png_names(paths) == [
        "cdf_azure-conv_w4_load1_err0.png",
        "cdf_azure-conv_w8_load1_err0.png",
        "p99_vs_workers_azure-conv.png",
        "slo_vs_workers_azure-conv.png",
    ]
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == sorted(_png_names(paths))


def test_plots_sweep_load_and_error_and_name_what_else_varies(tmp_path: Path) -> None:
    runs = [
        make_run(policy, seed=seed, load_scale=load, predictor_error=error)
        for load in (1.0, 2.0)
        for error in (0.0, 0.2)
        for policy in ("gaps", "oracle")
        for seed in (0, 1)
    ]
    names = _png_names(write_plots(runs, tmp_path, max_cdf_figures=1))
    assert names == [
        "cdf_azure-conv_w8_load1_err0.png",
        "p99_vs_load_azure-conv_err0.png",
        "slo_vs_load_azure-conv_err0.png",
        "p99_vs_load_azure-conv_err20.png",
        "slo_vs_load_azure-conv_err20.png",
        "p99_vs_error_azure-conv_load1.png",
        "slo_vs_error_azure-conv_load1.png",
        "p99_vs_error_azure-conv_load2.png",
        "slo_vs_error_azure-conv_load2.png",
    ]


def test_cdf_figures_are_capped(tmp_path: Path) -> None:
    runs = [make_run("gaps", workers=workers) for workers in range(1, 21)]
    names = _png_names(write_plots(runs, tmp_path, max_sweep_figures=0))
    assert len(names) == 12
    assert names[0] == "cdf_azure-conv_w1_load1_err0.png"


def test_a_missing_matplotlib_asks_for_the_report_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sweep_runs: list[dict[str, Any]]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ReportError, match=re.escape("pip install 'switchyard[report]'")):
        write_plots(sweep_runs, tmp_path)


def test_importing_the_reports_does_not_import_matplotlib() -> None:
    code = "import sys, research.report; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# --------------------------------------------------------------------- html


def test_html_report_is_self_contained(tmp_path: Path, sweep_runs: list[dict[str, Any]]) -> None:
    out_dir = tmp_path / "nested" / "report"
    page = write_report(sweep_runs, {"trace": "azure-conv", "seeds": [0, 1, 2]}, out_dir)
    assert page == out_dir / "index.html"
    html = page.read_text()
    assert "<style>" in html
    assert not re.search(r"(?:src|href)=['\"](?:https?:)?//", html)
    images = re.findall(r"<img src='([^']+)'", html)
    # Every figure written is shown, sweeps before the CDFs.
    assert sorted(images) == sorted(p.name for p in out_dir.glob("*.png"))
    assert images[:2] == ["p99_vs_workers_azure-conv.png", "slo_vs_workers_azure-conv.png"]
    assert len(images) == 4
    assert "gaps" in html
    assert "oracle (ref)" in html
    assert "best P99 (8 workers): gaps 2.00 s" in html
    assert "[0, 1, 2]" in html
    assert json.loads((out_dir / "runs.json").read_text()) == json.loads(runs_to_json(sweep_runs))


def test_html_escapes_every_name(tmp_path: Path) -> None:
    evil = "<script>alert('x')</script>"
    runs = [make_run(evil, seed=seed) for seed in (0, 1)] + [make_run("jsq")]
    page = write_report(runs, {"note": "<b>bold</b> & more"}, tmp_path, plots=False)
    html = page.read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; more" in html


def test_report_into_an_existing_file_is_a_clear_error(
    tmp_path: Path, sweep_runs: list[dict[str, Any]]
) -> None:
    target = tmp_path / "report"
    target.write_text("not a folder")
    with pytest.raises(ReportError, match="a file with that name exists"):
        write_report(sweep_runs, {}, target)
