"""Trace input: the strict Azure reader, the Trace type, transforms and generators (the
specs that name them: test_trace_specs.py)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.traces import (
    BUNDLED_SAMPLES,
    LognormalLengths,
    ResampledLengths,
    Trace,
    TraceFormatError,
    TraceRequest,
    bundled_mix,
    bundled_sample,
    bursty,
    diurnal,
    head,
    interleave,
    load_azure_trace,
    poisson,
    read_azure_trace,
    scale_load,
    window,
)
from switchyard.traces.synthetic import bursty_mean_rate_rps

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_ROWS = (
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.0000000,879,15\n"
)


def _csv(tmp_path: Path, text: str, name: str = "x.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(TraceFormatError) as caught:
        load_azure_trace(path, WorkloadType.CODE)
    message = str(caught.value)
    assert "\n" not in message
    return message


def _trace(*arrivals_s: float) -> Trace:
    return Trace.from_requests(
        "t",
        "test",
        (TraceRequest(a, 10, 5, WorkloadType.OTHER) for a in arrivals_s),
    )


# The Azure reader -------------------------------------------------------------------


def test_a_good_file_reads_with_arrivals_relative_to_the_first_row(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER + GOOD_ROWS + "\n")  # a trailing blank line is fine
    trace = load_azure_trace(path, WorkloadType.CONVERSATION)
    assert trace.name == "x"
    assert trace.source == str(path)
    assert [r.arrival_s for r in trace] == pytest.approx([0.0, 4.314579, 4.31941])
    assert trace.requests[0] == TraceRequest(0.0, 374, 44, WorkloadType.CONVERSATION)
    as_list = read_azure_trace(path, WorkloadType.CODE, limit=2)
    assert [(r.prompt_tokens, r.output_tokens, r.workload) for r in as_list] == [
        (374, 44, WorkloadType.CODE),
        (396, 109, WorkloadType.CODE),
    ]


def test_the_seventh_fractional_digit_is_kept(tmp_path: Path) -> None:
    path = _csv(
        tmp_path, HEADER + "2023-11-16 18:00:00.0000000,1,1\n2023-11-16 18:00:00.0000003,1,1\n"
    )
    assert load_azure_trace(path, WorkloadType.CODE).duration_s == pytest.approx(3e-7)


def test_extra_columns_in_any_order_are_ignored(tmp_path: Path) -> None:
    path = _csv(
        tmp_path, "GeneratedTokens,Model,ContextTokens,TIMESTAMP\n7,m,3,2023-11-16 18:00:00\n"
    )
    assert load_azure_trace(path, WorkloadType.CODE).requests == (
        TraceRequest(0.0, 3, 7, WorkloadType.CODE),
    )


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            "2023-11-16 18:00:00.0,-3,4\n",
            "line 2, ContextTokens: must be a positive integer, got '-3'",
        ),
        (
            "2023-11-16 18:00:00.0,3,4\n2023-11-16 18:00:01.0,3,0\n",
            "line 3, GeneratedTokens: must be a positive integer, got '0'",
        ),
        (
            "2023-11-16 18:00:00.0,0,4\n",
            "line 2, ContextTokens: must be a positive integer, got '0'",
        ),
        (
            "2023-11-16 18:00:00.0,12.5,4\n",
            "line 2, ContextTokens: must be a positive integer, got '12.5'",
        ),
        (
            "2023-11-16 18:00:00.0,3,\n",
            "line 2, GeneratedTokens: must be a positive integer, got ''",
        ),
        (
            "yesterday,3,4\n",
            "line 2, TIMESTAMP: expected a date and time 'YYYY-MM-DD HH:MM:SS[.fraction]', "
            "got 'yesterday'",
        ),
        (
            "2023-13-16 18:00:00.0,3,4\n",
            "line 2, TIMESTAMP: expected a date and time 'YYYY-MM-DD HH:MM:SS[.fraction]', "
            "got '2023-13-16 18:00:00.0'",
        ),
        (
            "2023-11-16 18:00:05.0,3,4\n2023-11-16 18:00:06.0,3,4\n2023-11-16 18:00:04.9,3,4\n",
            "line 4, TIMESTAMP: goes backwards, '2023-11-16 18:00:04.9' is earlier than "
            "'2023-11-16 18:00:06.0' on line 3",
        ),
        ("2023-11-16 18:00:00.0,3\n", "line 2, row: expected 3 fields, got 2"),
        ("2023-11-16 18:00:00.0,3,4,5\n", "line 2, row: expected 3 fields, got 4"),
    ],
)
def test_a_bad_row_names_the_file_line_and_field(tmp_path: Path, rows: str, expected: str) -> None:
    path = _csv(tmp_path, HEADER + rows)
    assert _error(path) == f"{path}, {expected}"


def test_a_row_after_a_blank_line_keeps_its_real_line_number(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER + "2023-11-16 18:00:00.0,3,4\n\n2023-11-16 18:00:01.0,-1,4\n")
    assert _error(path).startswith(f"{path}, line 4, ContextTokens:")


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    path = _csv(tmp_path, "")
    assert _error(path) == (
        f"{path}: the file is empty; expected the header TIMESTAMP,ContextTokens,GeneratedTokens"
    )


def test_a_header_without_rows_has_no_requests(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER)
    assert _error(path) == f"{path}: the trace has no requests"


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path, "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00.0,3\n")
    assert _error(path) == (
        f"{path}, line 1, GeneratedTokens: missing column (header: 'TIMESTAMP,ContextTokens'; "
        "expected TIMESTAMP,ContextTokens,GeneratedTokens)"
    )


def test_a_duplicate_column_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n")
    assert _error(path).startswith(f"{path}, line 1, ContextTokens: duplicate column")


def test_a_file_that_is_not_csv_text_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(HEADER.encode() + b"\xff\xfe,1,2\n")
    assert _error(path).startswith(f"{path}: not UTF-8 text (byte ")


def test_a_missing_file_says_no_such_file(tmp_path: Path) -> None:
    assert _error(tmp_path / "gone.csv") == f"{tmp_path / 'gone.csv'}: no such file"


def test_limit_reads_the_first_rows_and_must_be_positive(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER + GOOD_ROWS + "not,even,close\n")
    assert len(load_azure_trace(path, WorkloadType.CODE, limit=3)) == 3
    with pytest.raises(ValueError, match="limit"):
        load_azure_trace(path, WorkloadType.CODE, limit=0)


@pytest.mark.parametrize("workload", [WorkloadType.CODE, WorkloadType.CONVERSATION])
def test_the_bundled_samples_load(workload: WorkloadType) -> None:
    trace = bundled_sample(workload)
    assert len(trace) == 1000
    arrivals_s = [r.arrival_s for r in trace]
    assert arrivals_s[0] == 0.0
    assert arrivals_s == sorted(arrivals_s)
    assert {r.workload for r in trace} == {workload}
    assert trace.source == str(BUNDLED_SAMPLES[workload])


def test_the_bundled_mix_interleaves_both_samples() -> None:
    mix = bundled_mix()
    assert len(mix) == 2000
    assert [r.arrival_s for r in mix] == sorted(r.arrival_s for r in mix)
    assert len(bundled_mix(limit_per_trace=10)) == 20


# The Trace type ---------------------------------------------------------------------


def test_from_requests_sorts_and_rebases() -> None:
    trace = _trace(12.0, 10.0, 11.5)
    assert [r.arrival_s for r in trace] == [0.0, 1.5, 2.0]
    assert len(trace) == 3
    assert trace.duration_s == 2.0
    assert trace.mean_rate_rps == 1.0  # 2 gaps over 2 s
    assert trace.inter_arrivals_s() == [1.5, 0.5]


def test_a_single_request_has_no_rate() -> None:
    assert _trace(5.0).mean_rate_rps == 0.0


@pytest.mark.parametrize(
    ("arrivals_s", "message"),
    [((), "no requests"), ((1.0, 2.0), "first arrival"), ((0.0, 2.0, 1.0), "arrives before")],
)
def test_a_trace_keeps_its_invariants(arrivals_s: tuple[float, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Trace(
            "t",
            "test",
            tuple(TraceRequest(a, 1, 1, WorkloadType.OTHER) for a in arrivals_s),
        )


@pytest.mark.parametrize(
    ("arrival_s", "prompt_tokens", "output_tokens", "field"),
    [(-1.0, 1, 1, "arrival_s"), (0.0, 0, 1, "prompt_tokens"), (0.0, 1, 0, "output_tokens")],
)
def test_a_request_rejects_impossible_values(
    arrival_s: float, prompt_tokens: int, output_tokens: int, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        TraceRequest(arrival_s, prompt_tokens, output_tokens, WorkloadType.OTHER)


# Transforms -------------------------------------------------------------------------


def test_scale_load_by_two_doubles_the_rate() -> None:
    trace = bundled_sample(WorkloadType.CONVERSATION)
    doubled = scale_load(trace, 2)
    assert doubled.mean_rate_rps == pytest.approx(2 * trace.mean_rate_rps)
    assert doubled.duration_s == pytest.approx(trace.duration_s / 2)
    assert [(r.prompt_tokens, r.output_tokens) for r in doubled] == [
        (r.prompt_tokens, r.output_tokens) for r in trace
    ]
    assert doubled.source == trace.source
    assert doubled.name == "azure-conv-sample*2"


@pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan")])
def test_scale_load_needs_a_positive_factor(factor: float) -> None:
    with pytest.raises(ValueError, match="factor"):
        scale_load(_trace(0.0, 1.0), factor)


def test_window_keeps_a_half_open_interval_and_rebases() -> None:
    trace = _trace(0.0, 1.0, 2.5, 3.0, 4.0)
    cut = window(trace, 2.0, 4.0)
    assert [r.arrival_s for r in cut] == [0.0, 0.5]
    assert cut.name == "t[2s:4s]"
    assert [r.arrival_s for r in window(trace, 3.0)] == [0.0, 1.0]


def test_an_empty_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="holds no requests"):
        window(_trace(0.0, 1.0), 1.5, 2.0)
    with pytest.raises(ValueError, match="end_s"):
        window(_trace(0.0, 1.0), 1.0, 1.0)
    with pytest.raises(ValueError, match="start_s"):
        window(_trace(0.0, 1.0), -1.0)


def test_head_takes_the_first_requests() -> None:
    trace = _trace(0.0, 1.0, 2.0)
    assert [r.arrival_s for r in head(trace, 2)] == [0.0, 1.0]
    assert head(trace, 10) is trace
    with pytest.raises(ValueError, match="n must be"):
        head(trace, 0)


def test_interleave_merges_by_arrival_and_lists_every_source() -> None:
    mixed = interleave("both", [_trace(0.0, 2.0), scale_load(_trace(0.0, 2.0), 2)])
    assert [r.arrival_s for r in mixed] == [0.0, 0.0, 1.0, 2.0]
    assert mixed.source == "test + test"


# Synthetic generators ---------------------------------------------------------------


def _poisson(seed: int) -> Trace:
    return poisson(8.0, 500, seed=seed)


def _bursty(seed: int) -> Trace:
    return bursty(2.0, 20.0, 500, mean_base_s=5.0, mean_burst_s=1.0, seed=seed)


def _diurnal(seed: int) -> Trace:
    return diurnal(8.0, 500, amplitude=0.5, period_s=30.0, seed=seed)


@pytest.mark.parametrize("generate", [_poisson, _bursty, _diurnal])
def test_a_generator_is_deterministic_per_seed_and_differs_across_seeds(
    generate: Callable[[int], Trace],
) -> None:
    first, again, other = generate(1), generate(1), generate(2)
    assert first == again
    assert [r.arrival_s for r in first] != [r.arrival_s for r in other]
    assert [r.prompt_tokens for r in first] != [r.prompt_tokens for r in other]
    assert len(first) == 500
    assert first.requests[0].arrival_s == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_matches_its_rate(seed: int) -> None:
    assert poisson(8.0, 5000, seed=seed).mean_rate_rps == pytest.approx(8.0, rel=0.1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bursty_matches_its_long_run_rate(seed: int) -> None:
    trace = bursty(5.0, 40.0, 20000, mean_base_s=2.0, mean_burst_s=0.5, seed=seed)
    expected_rps = bursty_mean_rate_rps(5.0, 40.0, 2.0, 0.5)
    assert expected_rps == 12.0
    assert trace.mean_rate_rps == pytest.approx(expected_rps, rel=0.1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_diurnal_matches_its_mean_rate(seed: int) -> None:
    trace = diurnal(10.0, 6000, amplitude=0.8, period_s=60.0, seed=seed)
    assert trace.mean_rate_rps == pytest.approx(10.0, rel=0.1)


def _coefficient_of_variation(trace: Trace) -> float:
    gaps_s = trace.inter_arrivals_s()
    return statistics.stdev(gaps_s) / statistics.mean(gaps_s)


def test_bursty_gaps_vary_more_than_poisson_gaps() -> None:
    poisson_cv = _coefficient_of_variation(poisson(12.0, 5000, seed=3))
    bursty_cv = _coefficient_of_variation(
        bursty(5.0, 40.0, 5000, mean_base_s=2.0, mean_burst_s=0.5, seed=3)
    )
    assert poisson_cv == pytest.approx(1.0, abs=0.1)
    assert bursty_cv > 1.3 * poisson_cv


def test_diurnal_is_busier_in_the_peak_half_period() -> None:
    period_s = 60.0
    trace = diurnal(10.0, 6000, amplitude=0.8, period_s=period_s, seed=4)
    peak = sum(1 for r in trace if r.arrival_s % period_s < period_s / 2)
    trough = len(trace) - peak
    assert peak > 2 * trough  # the expected ratio is (1 + 1.6/pi) / (1 - 1.6/pi), about 3


def test_arrivals_do_not_depend_on_the_length_sampler() -> None:
    lognormal = LognormalLengths(1000.0, 1.0, 100.0, 1.0)
    resampled = poisson(8.0, 200, seed=5)
    assert [r.arrival_s for r in poisson(8.0, 200, seed=5, lengths=lognormal)] == [
        r.arrival_s for r in resampled
    ]


def test_resampled_lengths_come_from_the_source_with_its_workload() -> None:
    code = bundled_sample(WorkloadType.CODE)
    trace = poisson(8.0, 300, seed=6, lengths=ResampledLengths(code))
    pairs = {(r.prompt_tokens, r.output_tokens) for r in code}
    assert all((r.prompt_tokens, r.output_tokens) in pairs for r in trace)
    assert {r.workload for r in trace} == {WorkloadType.CODE}
    assert "resampled from azure-code-sample" in trace.source
    # The default is the bundled conversation sample.
    assert {r.workload for r in poisson(8.0, 50)} == {WorkloadType.CONVERSATION}


def test_lognormal_lengths_have_the_given_median_workload_and_cap() -> None:
    lengths = LognormalLengths(500.0, 0.8, 50.0, 0.5, workload=WorkloadType.CODE, max_tokens=2000)
    trace = poisson(8.0, 4000, seed=7, lengths=lengths)
    assert statistics.median(r.prompt_tokens for r in trace) == pytest.approx(500, rel=0.1)
    assert statistics.median(r.output_tokens for r in trace) == pytest.approx(50, rel=0.1)
    assert max(r.prompt_tokens for r in trace) <= 2000
    assert min(r.output_tokens for r in trace) >= 1
    assert {r.workload for r in trace} == {WorkloadType.CODE}


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: poisson(0.0, 10), "rate_rps"),
        (lambda: poisson(1.0, 0), "requests"),
        (lambda: bursty(-1.0, 5.0, 10), "base_rate_rps"),
        (lambda: bursty(5.0, 5.0, 10), "burst_rate_rps"),
        (lambda: bursty(1.0, 5.0, 10, mean_burst_s=0.0), "mean_burst_s"),
        (lambda: diurnal(0.0, 10), "mean_rate_rps"),
        (lambda: diurnal(1.0, 10, amplitude=1.5), "amplitude"),
        (lambda: diurnal(1.0, 10, amplitude=-0.1), "amplitude"),
        (lambda: diurnal(1.0, 10, period_s=0.0), "period_s"),
        (lambda: LognormalLengths(0.0, 1.0, 10.0, 1.0), "prompt_median_tokens"),
        (lambda: LognormalLengths(10.0, 1.0, 10.0, -1.0), "output_sigma"),
    ],
)
def test_generator_parameters_are_validated_by_name(
    make: Callable[[], object], parameter: str
) -> None:
    with pytest.raises(ValueError, match=parameter):
        make()
