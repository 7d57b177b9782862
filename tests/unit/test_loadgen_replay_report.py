"""The replay report's figures on hand-built records: counts, percentiles, SLO, goodput,
the breakdown, the JSON document and the text table."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loadgen.replay_answers import parse_answer
from loadgen.replay_plots import rolling_quantile
from loadgen.replay_records import (
    CANCELLED,
    HTTP_ERROR,
    NOT_SENT,
    OK,
    REJECTED,
    TIMEOUT,
    TRANSPORT_ERROR,
    ReplayResult,
    RequestRecord,
)
from loadgen.replay_report import report_document, write_report
from loadgen.replay_summary import per_app_summaries, summarize
from loadgen.replay_text import EMULATED_NOTE, format_report


def record(index: int, outcome: str = OK, **fields: Any) -> RequestRecord:
    """A record sent at ``index`` seconds with no lag unless ``fields`` say otherwise."""
    base: dict[str, Any] = {
        "index": index,
        "request_id": f"run-{index}",
        "kind": "llm",
        "app": "llama-2-7b",
        "workload": "conversation",
        "arrival_s": float(index),
        "scheduled_s": float(index),
        "outcome": outcome,
    }
    if outcome != NOT_SENT:
        base.update(sent_s=float(index), send_lag_s=0.0)
    if outcome == OK:
        base.update(status_code=200, latency_s=1.0)
    base.update(fields)
    return RequestRecord(**base)


def timeline(arrival_s: float, assigned_s: float, started_s: float, finished_s: float) -> Any:
    return {
        "arrival_s": arrival_s,
        "assigned_s": assigned_s,
        "started_s": started_s,
        "first_token_s": started_s,
        "finished_s": finished_s,
    }


def test_latency_percentiles_are_over_2xx_answers_only() -> None:
    # 1..10 s answered, plus an error that took 100 s: the error is not a latency.
    records = [record(i, latency_s=float(i + 1)) for i in range(10)]
    records.append(record(10, HTTP_ERROR, status_code=500, latency_s=100.0))

    summary = summarize(records, duration_s=20.0)

    assert summary.latency_p50_s == pytest.approx(5.5)
    assert summary.latency_p90_s == pytest.approx(9.1)
    assert summary.latency_p99_s == pytest.approx(9.91)
    assert summary.latency_mean_s == pytest.approx(5.5)
    assert summary.latency_max_s == 10.0
    assert summary.answered_ok == 10
    assert summary.sent == 11


def test_counts_split_errors_by_status_rejections_timeouts_and_transport() -> None:
    records = [
        record(0),
        record(1, HTTP_ERROR, status_code=404),
        record(2, HTTP_ERROR, status_code=404),
        record(3, REJECTED, status_code=429, retry_after_s=1.0),
        record(4, REJECTED, status_code=503),
        record(5, TIMEOUT),
        record(6, TRANSPORT_ERROR),
        record(7, CANCELLED),
        record(8, NOT_SENT),
    ]

    summary = summarize(records, duration_s=10.0)

    assert summary.planned == 9
    assert summary.sent == 8
    assert summary.not_sent == 1
    assert summary.errors_by_status == {"404": 2, "429": 1, "503": 1}
    assert summary.rejected == 2
    assert summary.http_errors == 2
    assert summary.timeouts == 1
    assert summary.transport_errors == 1
    assert summary.cancelled == 1


def test_slo_violations_count_missed_deadlines_and_every_failure() -> None:
    records = [
        record(0, deadline_met=True),
        record(1, deadline_met=True),
        record(2, deadline_met=False),
        record(3),  # silent about its deadline: not judged
        record(4, REJECTED, status_code=429),
        record(5, TIMEOUT),
        record(6, CANCELLED),  # stopped by us: not judged
        record(7, NOT_SENT),
    ]

    summary = summarize(records, duration_s=4.0)

    assert summary.slo_judged == 5
    assert summary.slo_violations == 3
    assert summary.slo_violation_rate == pytest.approx(3 / 5)
    assert summary.deadline_unknown == 1
    # Goodput: the two answers within their deadline over 4 s of replay.
    assert summary.goodput_rps == pytest.approx(0.5)
    assert summary.throughput_rps == pytest.approx(4 / 4.0)


def test_rates_are_undefined_without_duration() -> None:
    summary = summarize([record(0, deadline_met=True)], duration_s=0.0)

    assert summary.goodput_rps is None
    assert summary.throughput_rps is None


def test_breakdown_takes_medians_and_p99_of_each_component() -> None:
    records = [
        # scheduling 0.1, queueing 0.2, execution 1.0, client latency 1.5 -> overhead 0.5
        record(0, latency_s=1.5, timeline=timeline(10.0, 10.1, 10.3, 11.3)),
        # scheduling 0.3, queueing 0.4, execution 2.0, client latency 2.1 -> overhead 0.1
        record(1, latency_s=2.1, timeline=timeline(20.0, 20.3, 20.7, 22.7)),
        # no timeline at all: left out
        record(2, latency_s=9.0),
        # only arrival and assigned: counts for scheduling (0.5) only
        record(3, latency_s=3.0, timeline={"arrival_s": 1.0, "assigned_s": 1.5}),
        # an error's timeline is never used
        record(4, HTTP_ERROR, status_code=500, timeline=timeline(0.0, 50.0, 60.0, 70.0)),
    ]

    parts = summarize(records, duration_s=10.0).breakdown

    assert parts["scheduling"].count == 3
    assert parts["scheduling"].p50_s == pytest.approx(0.3)
    assert parts["scheduling"].p99_s == pytest.approx(0.3 + 0.98 * 0.2)
    assert parts["queueing"].count == 2
    assert parts["queueing"].p50_s == pytest.approx(0.3)
    assert parts["execution"].p50_s == pytest.approx(1.5)
    assert parts["execution"].p99_s == pytest.approx(1.0 + 0.99 * 1.0)
    assert parts["overhead"].count == 2
    assert parts["overhead"].p50_s == pytest.approx(0.3)


def test_an_empty_breakdown_is_none_not_zero() -> None:
    parts = summarize([record(0)], duration_s=1.0).breakdown

    assert all(part.count == 0 and part.p50_s is None for part in parts.values())


def test_ttft_and_tpot_come_from_the_server_timeline_and_are_judged_by_workload() -> None:
    def answered(index: int, workload: str, ttft_s: float, tpot_s: float) -> RequestRecord:
        first_s = 100.0 + ttft_s
        return record(
            index,
            workload=workload,
            completion_tokens=11,
            timeline={
                "arrival_s": 100.0,
                "first_token_s": first_s,
                "finished_s": first_s + 10 * tpot_s,
            },
        )

    records = [
        answered(0, "conversation", 0.8, 0.05),  # met (TTFT 1 s)
        answered(1, "code", 0.8, 0.05),  # missed: code waits at most 0.5 s
        answered(2, "conversation", 0.2, 0.15),  # missed: TPOT over 0.1 s
        record(3, TIMEOUT),  # no answer: a miss
        record(4, OK),  # no timeline: not judged
        record(5, OK, kind="classification", app="digits", workload="classification"),
    ]

    summary = summarize(records, duration_s=10.0)

    assert summary.token_slo_judged == 4
    assert summary.token_slo_attainment == pytest.approx(0.25)
    assert summary.token_goodput_rps == pytest.approx(0.1)
    assert summary.ttft_p50_s == pytest.approx(0.8)
    assert summary.tpot_p99_s == pytest.approx(0.15, rel=0.05)
    text = format_report(summary, per_app_summaries(records, 10.0), {"trace": "t"})
    assert "25.0% of 4 LLM requests met their TTFT and TPOT objectives" in text


def test_emulated_share_and_send_lag() -> None:
    records = [
        record(0, emulated=True, send_lag_s=0.0),
        record(1, emulated=True, send_lag_s=0.002),
        record(2, emulated=False, send_lag_s=0.004),
        record(3, send_lag_s=0.1),
        record(4, HTTP_ERROR, status_code=400, emulated=True, send_lag_s=0.006),
    ]

    summary = summarize(records, duration_s=1.0)

    assert summary.emulated_answers == 2
    assert summary.emulated_share == pytest.approx(2 / 4)
    assert summary.send_lag_p50_s == pytest.approx(0.004)
    assert summary.send_lag_max_s == pytest.approx(0.1)
    assert summary.send_lag_p99_s == pytest.approx(0.006 + 0.96 * 0.094)


def test_per_app_summaries_split_by_application() -> None:
    records = [
        record(0, latency_s=1.0),
        record(1, latency_s=3.0),
        record(2, app="llama-2-13b", latency_s=7.0),
        record(3, app="digits", kind="classification", outcome=HTTP_ERROR, status_code=404),
    ]

    apps = per_app_summaries(records, duration_s=2.0)

    assert list(apps) == ["digits", "llama-2-13b", "llama-2-7b"]
    assert apps["llama-2-7b"].latency_p50_s == pytest.approx(2.0)
    assert apps["llama-2-13b"].latency_max_s == 7.0
    assert apps["digits"].errors_by_status == {"404": 1}
    assert apps["digits"].latency_p50_s is None


def result_of(records: list[RequestRecord]) -> ReplayResult:
    return ReplayResult(
        run_id="run",
        target="http://127.0.0.1:9",
        speedup=2.0,
        timeout_s=5.0,
        started_at="2024-01-01T00:00:00+00:00",
        duration_s=4.0,
        stopped=False,
        records=records,
    )


def test_the_json_document_has_config_summary_per_app_and_requests() -> None:
    records = [
        record(0, deadline_met=True, emulated=True, timeline=timeline(0, 0.1, 0.2, 0.7)),
        record(1, REJECTED, status_code=429),
    ]

    document = report_document(result_of(records), {"trace": "azure-conv-sample", "seed": 3})
    text = json.dumps(document, allow_nan=False)  # strict JSON: no NaN anywhere
    loaded = json.loads(text)

    assert set(loaded) == {"config", "summary", "per_app", "requests"}
    assert loaded["config"]["trace"] == "azure-conv-sample"
    assert loaded["config"]["speedup"] == 2.0
    assert loaded["config"]["planned"] == 2
    assert loaded["summary"]["errors_by_status"] == {"429": 1}
    assert loaded["summary"]["goodput_rps"] == pytest.approx(0.25)
    assert loaded["summary"]["breakdown"]["execution"]["p50_s"] == pytest.approx(0.5)
    assert loaded["summary"]["latency_p90_s"] == pytest.approx(1.0)
    assert set(loaded["per_app"]) == {"llama-2-7b"}
    assert [r["request_id"] for r in loaded["requests"]] == ["run-0", "run-1"]
    assert loaded["requests"][1]["latency_s"] is None
    assert RequestRecord.from_json(loaded["requests"][0]) == records[0]


def test_the_table_states_the_emulated_share_and_lists_each_app() -> None:
    records = [
        record(0, emulated=True, deadline_met=True),
        record(1, app="llama-2-13b", emulated=True),
        record(2, HTTP_ERROR, status_code=404),
    ]
    summary = summarize(records, 2.0)

    text = format_report(summary, per_app_summaries(records, 2.0), {"trace": "t"})

    head = text.splitlines()[:2]
    assert "100%" in head[1]
    assert EMULATED_NOTE in head[1]
    rows = {line.split()[0] for line in text.splitlines() if line.startswith(("llama", "all"))}
    assert rows == {"llama-2-7b", "llama-2-13b", "all"}
    assert "404: 1" in text


def test_the_table_warns_when_the_generator_fell_behind() -> None:
    behind = [record(i, send_lag_s=0.5) for i in range(3)]
    on_time = [replace(r, send_lag_s=0.001) for r in behind]

    late = format_report(summarize(behind, 1.0), {})
    fine = format_report(summarize(on_time, 1.0), {})

    assert "fell behind" in late
    assert "fell behind" not in fine


def test_rolling_quantile_uses_the_trailing_window() -> None:
    assert rolling_quantile([1.0, 5.0, 3.0, 2.0], window=2, q=1.0) == [1.0, 5.0, 5.0, 3.0]


def test_write_report_makes_the_page_plots_and_json(tmp_path: Path) -> None:
    records = [
        record(i, latency_s=0.1 * (i + 1), emulated=True, timeline=timeline(0, 0.1, 0.2, 0.3))
        for i in range(20)
    ]

    page = write_report(result_of(records), tmp_path / "report", {"trace": "x"})

    html = page.read_text()
    for name in ("latency_cdf.png", "latency_over_time.png", "breakdown.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0
        assert name in html
    assert "performance model" in html
    assert json.loads((tmp_path / "report" / "replay.json").read_text())["config"]["trace"] == "x"


# --------------------------------------------------------------------------- parsing


def test_parse_answer_reads_an_llm_answer() -> None:
    body = {
        "id": "cmpl-1",
        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        "switchyard": {
            "request_id": "r-1",
            "status": "completed",
            "worker_id": "w1",
            "worker_type": "emulated",
            "variant": None,
            "emulated": True,
            "deadline_s": 30.0,
            "deadline_met": False,
            "timeline": {"arrival_s": 1.0, "assigned_s": 1.5, "first_token_s": None},
        },
    }

    fields = parse_answer("llm", 200, json.dumps(body).encode(), {})

    assert fields == {
        "outcome": OK,
        "completion_tokens": 7,
        "server_status": "completed",
        "worker_id": "w1",
        "worker_type": "emulated",
        "emulated": True,
        "deadline_s": 30.0,
        "deadline_met": False,
        "timeline": {"arrival_s": 1.0, "assigned_s": 1.5},
    }


def test_parse_answer_reads_a_classification_answer() -> None:
    body = {"label": 3, "class_name": "3", "variant": "mlp-small", "deadline_met": True}

    fields = parse_answer("classification", 200, json.dumps(body).encode(), {})

    assert fields == {
        "outcome": OK,
        "label": 3,
        "class_name": "3",
        "variant": "mlp-small",
        "deadline_met": True,
    }


def test_parse_answer_is_tolerant_of_junk() -> None:
    assert parse_answer("llm", 200, b"not json", {}) == {"outcome": OK}
    assert parse_answer("llm", 200, b"[1, 2]", {}) == {"outcome": OK}
    wrong_types = {"switchyard": {"emulated": "yes", "deadline_s": "soon", "timeline": [1]}}
    assert parse_answer("llm", 200, json.dumps(wrong_types).encode(), {}) == {"outcome": OK}
    assert parse_answer("llm", 502, b"Bad Gateway", {}) == {
        "outcome": HTTP_ERROR,
        "error_message": "Bad Gateway",
    }


def test_parse_answer_reads_the_switchyard_block_of_an_error() -> None:
    body = {
        "error": {"message": "missed", "type": "server_error", "code": "deadline_expired"},
        "switchyard": {"request_id": "r", "status": "expired", "deadline_met": False},
    }

    fields = parse_answer("llm", 504, json.dumps(body).encode(), {})

    assert fields["outcome"] == HTTP_ERROR
    assert fields["error_code"] == "deadline_expired"
    assert fields["server_status"] == "expired"
    assert fields["deadline_met"] is False


def test_parse_answer_falls_back_to_the_emulated_header() -> None:
    answer = json.dumps({"label": 0}).encode()

    marked = parse_answer("classification", 200, answer, {"x-switchyard-emulated": "true"})
    unmarked = parse_answer("classification", 200, answer, {})

    assert marked["emulated"] is True
    assert "emulated" not in unmarked


def test_parse_answer_reads_errors_and_retry_after() -> None:
    error = {"error": {"message": "busy", "type": "overloaded", "param": None, "code": 429}}

    fields = parse_answer("llm", 429, json.dumps(error).encode(), {"retry-after": "2"})

    assert fields == {
        "outcome": REJECTED,
        "retry_after_s": 2.0,
        "error_type": "overloaded",
        "error_message": "busy",
        "error_code": "429",
    }
    assert parse_answer("llm", 503, b"", {"retry-after": "Wed, 21 Oct 2015"}) == {
        "outcome": REJECTED
    }
    assert math.isclose(
        parse_answer("classification", 503, b"{}", {"retry-after": "0.5"})["retry_after_s"], 0.5
    )
