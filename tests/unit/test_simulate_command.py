"""`switchyard simulate` as a user runs it: its errors, its table and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--quiet", *args])
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def test_a_negative_token_count_names_the_file_row_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad_conv.csv"
    trace.write_text(
        HEADER + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,-3,109\n"
    )

    code, _, err = simulate(capsys, "--trace", str(trace), "--policies", "jsq")

    assert_one_line_error(code, err, "bad_conv.csv", "3", "ContextTokens")


def test_an_empty_trace_says_it_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "empty_code.csv"
    trace.write_text(HEADER)

    code, _, err = simulate(capsys, "--trace", str(trace))

    assert_one_line_error(code, err, "empty_code.csv")
    assert "no requests" in err or "empty" in err


def test_an_unknown_policy_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate(capsys, "--policies", "jsq,fastest", "--requests", "50")

    assert_one_line_error(code, err, "'fastest'", "gaps", "round-robin")


def test_an_unknown_profile_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate(capsys, "--gpu", "a100-80gb/llama-9-1b", "--requests", "50")

    assert_one_line_error(code, err, "llama-9-1b")


def test_a_missing_trace_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate(capsys, "--trace", "/nonexistent/trace.csv")

    assert_one_line_error(code, err, "/nonexistent/trace.csv")


def test_the_table_and_json_hold_every_policy_and_repeat_for_a_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = []
    for name in ("a.json", "b.json"):
        code, out, _ = simulate(
            capsys,
            "--trace", "azure-conv-sample",
            "--requests", "300",
            "--workers", "2",
            "--load-scale", "8",
            "--policies", "round-robin,gaps,oracle",
            "--json", str(tmp_path / name),
        )  # fmt: skip
        assert code == 0
        documents.append(json.loads((tmp_path / name).read_text()))

    for policy in ("round-robin", "gaps", "oracle"):
        assert policy in out
    first, second = documents
    assert [r["policy"] for r in first["runs"]] == ["round-robin", "gaps", "oracle"]
    required = {
        "policy", "workers", "seed", "trace", "requests", "completed", "p50_s", "p90_s",
        "p99_s", "slo_violation_rate", "migrations", "migration_cost_s", "mean_utilization",
        "load_cov", "throughput_rps", "sim_wall_s",
    }  # fmt: skip
    for run in first["runs"]:
        assert required <= run.keys()
        assert run["completed"] == run["requests"] == 300

    def without_clock(document: dict[str, object]) -> object:
        runs = document["runs"]
        assert isinstance(runs, list)
        return [
            {k: v for k, v in run.items() if k not in ("sim_wall_s", "simulated_rps")}
            for run in runs
        ]

    assert without_clock(first) == without_clock(second)
    assert first["config"] == second["config"]


def test_the_capacity_search_names_each_policys_capacity_and_a_stricter_target_holds_less(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "capacity.json"
    code, out, _ = simulate(
        capsys,
        "--trace", "azure-conv-sample",
        "--requests", "300",
        "--workers", "2",
        "--policies", "round-robin,jsq",
        "--capacity",
        "--json", str(out_file),
    )  # fmt: skip

    assert code == 0
    assert "req/s @90%" in out
    assert "req/s @99%" in out
    assert "highest capacity at 90% (2 workers):" in out
    document = json.loads(out_file.read_text())
    assert [r["policy"] for r in document["capacity"]] == ["round-robin", "jsq"]
    for result in document["capacity"]:
        lenient, strict = result["targets"]
        assert lenient["held"]["slo_attainment"] >= 0.90 > lenient["failed"]["slo_attainment"]
        assert strict["held"]["slo_attainment"] >= 0.99
        assert strict["held"]["load_scale"] <= lenient["held"]["load_scale"]
        assert lenient["failed"]["load_scale"] <= lenient["held"]["load_scale"] * 1.02
        assert result["max_goodput"]["goodput_rps"] > 0


def test_the_token_objectives_decide_what_counts_as_good(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attainment = {}
    for ttft_s in ("10", "0.001"):
        out_file = tmp_path / f"ttft-{ttft_s}.json"
        code, _, _ = simulate(
            capsys,
            "--trace", "azure-conv-sample",
            "--requests", "200",
            "--policies", "jsq",
            "--ttft-slo-s", ttft_s,
            "--json", str(out_file),
        )  # fmt: skip
        assert code == 0
        (run,) = json.loads(out_file.read_text())["runs"]
        attainment[ttft_s] = run["slo_attainment"]
    assert attainment["10"] > 0.9
    assert attainment["0.001"] == 0.0


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--capacity", "--targets", "0.9,1.5"), "--targets"),
        (("--capacity", "--load-scale", "1,2"), "--load-scale"),
        (("--ttft-slo-s", "0"), "--ttft-slo-s"),
        (("--tpot-slo-s", "nan"), "--tpot-slo-s"),
    ],
)
def test_bad_objectives_and_capacity_settings_are_named(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], named: str
) -> None:
    code, _, err = simulate(capsys, "--requests", "50", "--policies", "jsq", *args)

    assert_one_line_error(code, err, named)
