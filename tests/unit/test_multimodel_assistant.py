"""``switchyard multimodel --workload assistant``: the live stack's pipelines with LLM
stages, simulated on LLM workers a user sizes on the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from research.multimodel import command, command_report
from research.multimodel.assistant import assistant_workload, parse_llm_workers
from research.multimodel.errors import SimulationInputError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_calls_arrive_at_the_rate_to_each_pipeline_and_twice_as_fast_after_the_step() -> None:
    workload = assistant_workload(
        rate_rps=10.0, duration_s=200.0, seed=3, step_factor=2.0, step_at_s=100.0
    )
    before = [r for r in workload.requests if r.arrival_s < 100.0]
    after = [r for r in workload.requests if r.arrival_s >= 100.0]
    assert 900 < len(before) < 1100
    assert 1800 < len(after) < 2200
    shares = {p: sum(r.pipeline == p for r in workload.requests) for p in workload.pipelines}
    assert set(shares) == {"triage", "draft-verify"}
    assert min(shares.values()) > 0.45 * len(workload.requests)
    assert all(r.input_tokens == 200 for r in workload.requests)
    assert workload.step_at_s == 100.0
    again = assistant_workload(
        rate_rps=10.0, duration_s=200.0, seed=3, step_factor=2.0, step_at_s=100.0
    )
    assert again.requests == workload.requests


def test_by_default_each_llm_model_the_pipelines_use_gets_one_a100_worker() -> None:
    draft = parse_llm_workers(None, ["draft-verify"])[0]
    assert [(w.application, w.profiles) for w in parse_llm_workers(None, ["triage"])] == [
        ("llama-2-13b", ("a100-80gb/llama-2-13b",)),
        ("llama-2-7b", ("a100-80gb/llama-2-7b",)),
    ]
    assert draft.application == "llama-2-7b"
    two = parse_llm_workers(
        "llama-2-7b=l40s-48gb/llama-2-7b, llama-2-13b=a100-80gb/llama-2-13b:2", ["triage"]
    )
    assert {w.application: w.profiles for w in two} == {
        "llama-2-7b": ("l40s-48gb/llama-2-7b",),
        "llama-2-13b": ("a100-80gb/llama-2-13b",) * 2,
    }


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("llama-2-7b=a100-80gb/llama-2-7b", "no workers for llama-2-13b"),
        ("llama-2-7b", "is not MODEL=PROFILE"),
        ("llama-2-7b=a100-80gb/llama-2-7b:x,llama-2-13b=p", "not a whole number"),
        ("llama-2-7b=a:1,llama-2-7b=b:1", "given twice"),
    ],
)
def test_a_bad_llm_workers_spec_names_what_is_wrong(spec: str, fragment: str) -> None:
    with pytest.raises(SimulationInputError, match=fragment):
        parse_llm_workers(spec, ["draft-verify"])


def test_the_command_runs_the_llm_stages_and_a_second_13b_worker_shortens_the_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = (
        *("--workload", "assistant", "--policies", "gaps", "--duration-s", "60"),
        *("--rate-rps", "10", "--pipelines", "draft-verify", "--step-factor", "1"),
    )
    p99s = []
    for count in (1, 2):
        out = tmp_path / f"runs{count}.json"
        workers = f"llama-2-7b=a100-80gb/llama-2-7b,llama-2-13b=a100-80gb/llama-2-13b:{count}"
        argv = (*common, "--llm-workers", workers, "--json", str(out))
        assert command.run(_args(*argv)) == 0
        assert "LLM busy %" in capsys.readouterr().out
        document = json.loads(out.read_text())
        assert document["config"]["llm_policies"] == ["gaps"]  # the live stack's default
        assert document["config"]["llm_workers"]["llama-2-13b"] == ["a100-80gb/llama-2-13b"] * count
        (run,) = document["runs"]
        assert run["unfinished"] == 0
        assert 0 < run["llm_utilization"] <= 100
        p99s.append(run["p99_s"])
    assert p99s[1] < 0.8 * p99s[0]


def test_several_llm_policies_are_each_run_with_every_placement_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.json"
    argv = (
        *("--workload", "assistant", "--policies", "gaps,static-rr", "--duration-s", "20"),
        *("--llm-policy", "jsq,round-robin", "--json", str(out)),
    )
    assert command.run(_args(*argv)) == 0
    table = capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    pairs = [(run["policy"], run["llm_policy"]) for run in runs]
    assert pairs == [
        ("gaps / jsq", "jsq"),
        ("gaps / round-robin", "round-robin"),
        ("static-rr / jsq", "jsq"),
        ("static-rr / round-robin", "round-robin"),
    ]
    assert all(label in table for label, _ in pairs)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--pipelines", "triage"), "--pipelines needs --workload assistant"),
        (("--llm-policy", "jsq"), "--llm-policy needs --workload assistant"),
        (("--workload", "assistant", "--pipelines", "nope"), "unknown --pipelines 'nope'"),
        (("--workload", "assistant", "--llm-policy", "nope"), "unknown --llm-policy 'nope'"),
        (("--workload", "assistant", "--input-tokens", "0"), "--input-tokens must be"),
        (("--workload", "assistant", "--llm-workers", "x"), "is not MODEL=PROFILE"),
        (("--workload", "assistant", "--sweep", "fluctuation"), "needs --workload synthetic"),
    ],
)
def test_bad_assistant_inputs_are_one_line_and_exit_2(
    argv: tuple[str, ...], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert command.run(_args(*argv, "--duration-s", "5")) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1


def test_a_run_without_llm_workers_has_no_llm_column() -> None:
    base = {key: 1.0 for key, _, _ in command_report.METRICS}
    runs = [{**base, "llm_utilization": None, "policy": "p", "sweep": None, "value": None}]
    assert "LLM busy" not in command_report.format_table(runs)
