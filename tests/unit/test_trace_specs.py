"""Trace specs: the names, files and generator strings that ``--trace`` takes, and what each
resolves to."""

from __future__ import annotations

from pathlib import Path

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.traces import (
    BUNDLED_SAMPLES,
    Trace,
    TraceFormatError,
    TraceSpecError,
    bursty,
    diurnal,
    poisson,
    resolve_trace,
    sources,
    trace_help,
    trace_names,
)

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_ROWS = (
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.0000000,879,15\n"
)
SHARED_AZURE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure"


def _csv(tmp_path: Path, text: str, name: str = "x.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# Trace specs ------------------------------------------------------------------------


def _fake_azure_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "azure"
    directory.mkdir()
    for file_name in sources.AZURE_FILES.values():
        _csv(directory, HEADER + GOOD_ROWS, file_name)
    return directory


def test_full_traces_come_from_the_configured_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _fake_azure_dir(tmp_path)
    monkeypatch.setenv(sources.TRACE_DIR_ENV, str(directory))
    code = resolve_trace("azure-code")
    assert code.name == "azure-code"
    assert code.source == str(directory / "AzureLLMInferenceTrace_code.csv")
    assert {r.workload for r in code} == {WorkloadType.CODE}
    conv = resolve_trace("azure-conv")
    assert conv.source == str(directory / "AzureLLMInferenceTrace_conv.csv")
    assert len(resolve_trace("azure-mix")) == 6


def test_a_configured_directory_without_the_trace_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sources.TRACE_DIR_ENV, str(tmp_path))
    with pytest.raises(TraceFormatError, match=r"AzureLLMInferenceTrace_conv\.csv: no such file"):
        resolve_trace("azure-conv")


def test_full_traces_come_from_the_shared_directory_next_to_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(sources.TRACE_DIR_ENV, raising=False)
    directory = _fake_azure_dir(tmp_path)
    monkeypatch.setattr(sources, "SHARED_AZURE_DIR", directory)
    assert resolve_trace("azure-code").source == str(directory / "AzureLLMInferenceTrace_code.csv")


def test_full_traces_fall_back_to_the_bundled_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(sources.TRACE_DIR_ENV, raising=False)
    monkeypatch.setattr(sources, "SHARED_AZURE_DIR", tmp_path / "absent")
    trace = resolve_trace("azure-conv")
    assert trace.source == str(BUNDLED_SAMPLES[WorkloadType.CONVERSATION])
    assert trace.name == "azure-conv-sample"
    assert len(trace) == 1000


def test_the_shared_directory_is_next_to_the_repository() -> None:
    assert sources.SHARED_AZURE_DIR == SHARED_AZURE


@pytest.mark.parametrize(
    ("spec", "rows", "workloads"),
    [
        ("azure-code-sample", 1000, {WorkloadType.CODE}),
        ("azure-conv-sample", 1000, {WorkloadType.CONVERSATION}),
        ("azure-mix-sample", 2000, {WorkloadType.CODE, WorkloadType.CONVERSATION}),
    ],
)
def test_sample_specs_are_the_bundled_samples(
    spec: str, rows: int, workloads: set[WorkloadType]
) -> None:
    trace = resolve_trace(spec)
    assert trace.name == spec
    assert len(trace) == rows
    assert {r.workload for r in trace} == workloads
    assert all(str(p) in trace.source for w, p in BUNDLED_SAMPLES.items() if w in workloads)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("poisson:rate_rps=4,requests=300", poisson(4.0, 300, seed=0)),
        ("poisson", poisson(8.0, 2000, seed=0)),
        (
            "bursty:base_rate_rps=1,burst_rate_rps=9,requests=200,mean_base_s=3,mean_burst_s=1",
            bursty(1.0, 9.0, 200, mean_base_s=3.0, mean_burst_s=1.0, seed=0),
        ),
        (
            "diurnal: mean_rate_rps=5, requests=200, amplitude=0.3, period_s=20",
            diurnal(5.0, 200, amplitude=0.3, period_s=20.0, seed=0),
        ),
        ("poisson:requests=100,seed=9", poisson(8.0, 100, seed=9)),
    ],
)
def test_generator_specs_call_the_generators(spec: str, expected: Trace) -> None:
    assert resolve_trace(spec) == expected


def test_the_seed_argument_applies_unless_the_spec_gives_one() -> None:
    assert resolve_trace("poisson:requests=50", seed=3) == poisson(8.0, 50, seed=3)
    assert resolve_trace("poisson:requests=50,seed=4", seed=3) == poisson(8.0, 50, seed=4)


def test_generator_specs_choose_the_lengths() -> None:
    code = resolve_trace("poisson:requests=100,lengths=azure-code-sample")
    assert {r.workload for r in code} == {WorkloadType.CODE}
    lognormal = resolve_trace(
        "poisson:requests=100,lengths=lognormal,prompt_median_tokens=64,prompt_sigma=0,"
        "output_median_tokens=8,output_sigma=0,workload=code"
    )
    assert {(r.prompt_tokens, r.output_tokens, r.workload) for r in lognormal} == {
        (64, 8, WorkloadType.CODE)
    }


@pytest.mark.parametrize(
    ("file_name", "workload"),
    [
        ("my_code_trace.csv", WorkloadType.CODE),
        ("Conversation-2024.csv", WorkloadType.CONVERSATION),
        ("night.csv", WorkloadType.OTHER),
    ],
)
def test_a_path_spec_reads_the_file_with_the_workload_its_name_implies(
    tmp_path: Path, file_name: str, workload: WorkloadType
) -> None:
    path = _csv(tmp_path, HEADER + GOOD_ROWS, file_name)
    trace = resolve_trace(str(path))
    assert trace.source == str(path)
    assert {r.workload for r in trace} == {workload}


def test_a_missing_path_says_no_such_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as caught:
        resolve_trace(str(tmp_path / "absent.csv"))
    assert str(caught.value) == f"{tmp_path / 'absent.csv'}: no such file"


@pytest.mark.parametrize("spec", ["azure", "uniform:rate_rps=3", ""])
def test_an_unknown_name_lists_the_known_ones(spec: str) -> None:
    with pytest.raises(TraceSpecError) as caught:
        resolve_trace(spec)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"unknown trace {spec!r}; known names: ")
    assert all(name in message for name in trace_names())


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("poisson:rate=3", "poisson: unknown key 'rate'"),
        ("poisson:rate_rps=fast", "poisson: rate_rps must be a number, got 'fast'"),
        ("poisson:requests=1.5", "poisson: requests must be an integer, got '1.5'"),
        ("poisson:rate_rps=0", "poisson: rate_rps must be > 0, got 0.0"),
        ("poisson:rate_rps", "poisson: expected KEY=VALUE, got 'rate_rps'"),
        ("poisson:seed=1,seed=2", "poisson: seed is given twice"),
        ("poisson:rate_rps=nan", "poisson: rate_rps must be a finite number, got 'nan'"),
        ("diurnal:amplitude=2", "diurnal: amplitude must be in [0, 1], got 2.0"),
        ("poisson:prompt_sigma=1", "poisson: prompt_sigma applies only with lengths=lognormal"),
        ("poisson:lengths=elsewhere", "poisson: lengths must be lognormal, a trace name"),
        (
            "poisson:lengths=lognormal,workload=chat",
            "poisson: workload must be one of code, conversation, other, got 'chat'",
        ),
    ],
)
def test_a_bad_generator_parameter_names_it_and_the_valid_keys(spec: str, problem: str) -> None:
    with pytest.raises(TraceSpecError) as caught:
        resolve_trace(spec)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(problem)
    assert "; valid keys: " in message
    assert "rate_rps" in message.split("; valid keys: ")[1] or spec.startswith("diurnal")


def test_trace_names_and_help_cover_every_kind() -> None:
    names = trace_names()
    for name in ("azure-code", "azure-conv", "azure-code-sample", "azure-conv-sample"):
        assert name in names
    for name in ("azure-mix-sample", "poisson", "bursty", "diurnal"):
        assert name in names
    text = trace_help()
    assert all(name in text for name in names)
    assert "rate_rps=8" in text
