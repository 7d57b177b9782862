"""The request plan: bodies from the Azure sample rows, the mixes, the application map."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.traces import BUNDLED_SAMPLES, resolve_trace

from loadgen.mixes import (
    CLASSIFICATION_APPS,
    PlanError,
    build_plan,
    parse_app_map,
)


def sample_rows(workload: WorkloadType, n: int) -> list[tuple[int, int]]:
    """(ContextTokens, GeneratedTokens) of the first ``n`` rows, read independently."""
    with BUNDLED_SAMPLES[workload].open(newline="") as handle:
        rows = list(csv.DictReader(handle))[:n]
    return [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rows]


@pytest.mark.parametrize(
    ("name", "workload", "model"),
    [
        ("azure-conv-sample", WorkloadType.CONVERSATION, "llama-2-7b"),
        ("azure-code-sample", WorkloadType.CODE, "llama-2-13b"),
    ],
)
def test_llm_bodies_carry_the_rows_lengths_and_the_workloads_model(
    name: str, workload: WorkloadType, model: str
) -> None:
    plan = build_plan(resolve_trace(name), "llm", limit=20)

    bodies = [request.body("run7") for request in plan]

    assert len(plan) == 20
    assert [(b["switchyard"]["prompt_tokens"], b["max_tokens"]) for b in bodies] == sample_rows(
        workload, 20
    )
    assert {b["model"] for b in bodies} == {model}
    assert bodies[3] == {
        "model": model,
        "prompt": "",
        "max_tokens": bodies[3]["max_tokens"],
        "stream": False,
        "switchyard": {
            "prompt_tokens": bodies[3]["switchyard"]["prompt_tokens"],
            "workload": workload.value,
            "request_id": "run7-3",
        },
    }
    assert {request.path for request in plan} == {"/v1/completions"}


def test_a_mooncake_replay_names_each_prompts_blocks() -> None:
    trace = resolve_trace("mooncake-sample")
    plan = build_plan(trace, "llm", limit=5)

    for request, row in zip(plan, trace.requests, strict=False):
        options = request.body("run")["switchyard"]
        assert options["prefix_blocks"] == list(row.prefix_blocks)
        assert options["prompt_tokens"] == row.prompt_tokens


def test_the_mixed_sample_maps_each_workload_and_keeps_arrival_order() -> None:
    plan = build_plan(
        resolve_trace("azure-mix-sample"), "llm", limit=200, app_map=parse_app_map("code=tiny-lm")
    )

    by_workload = {(r.workload, r.app) for r in plan}
    assert by_workload == {("code", "tiny-lm"), ("conversation", "llama-2-7b")}
    arrivals = [r.arrival_s for r in plan]
    assert arrivals == sorted(arrivals)
    assert [r.index for r in plan] == list(range(200))


def test_a_csv_file_is_read_by_path(tmp_path: Path) -> None:
    trace = tmp_path / "my_code_trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,100,5\n"
        "2023-11-16 18:00:01.5,200,6\n"
    )

    plan = build_plan(resolve_trace(str(trace)), "llm")

    assert [(r.arrival_s, r.app, r.prompt_tokens, r.max_tokens) for r in plan] == [
        (0.0, "llama-2-13b", 100, 5),
        (1.5, "llama-2-13b", 200, 6),
    ]


def test_mixed_sends_exactly_the_share_chosen_by_the_seed() -> None:
    trace = resolve_trace("azure-conv-sample")

    first = build_plan(trace, "mixed", limit=100, seed=4, classification_share=0.3)
    again = build_plan(trace, "mixed", limit=100, seed=4, classification_share=0.3)
    other = build_plan(trace, "mixed", limit=100, seed=5, classification_share=0.3)

    chosen = [r.index for r in first if r.kind == "classification"]
    assert len(chosen) == 30
    assert first == again
    assert chosen != [r.index for r in other if r.kind == "classification"]
    # Arrivals are the trace's whatever the kind.
    assert [r.arrival_s for r in first] == [row.arrival_s for row in trace.requests[:100]]


@pytest.mark.parametrize(("share", "expected"), [(0.0, 0), (1.0, 50)])
def test_mixed_share_edges(share: float, expected: int) -> None:
    plan = build_plan(
        resolve_trace("azure-conv-sample"), "mixed", limit=50, classification_share=share
    )

    assert sum(r.kind == "classification" for r in plan) == expected


def test_classification_requests_carry_held_out_features_of_the_bundled_apps() -> None:
    from switchyard.apps.datasets import load_dataset

    plan = build_plan(resolve_trace("azure-conv-sample"), "classification", limit=60, seed=2)

    apps = Counter(r.app for r in plan)
    assert set(apps) == set(CLASSIFICATION_APPS)
    for request in plan:
        dataset = load_dataset(request.app)
        assert len(request.features) == dataset.feature_dim
        assert request.true_label is not None
        assert request.path == f"/v1/apps/{request.app}/infer"
        body = request.body("r")
        assert body == {"features": list(request.features), "request_id": f"r-{request.index}"}
        assert all(isinstance(x, float) for x in body["features"])
    # The features are a real test row with that label.
    first = plan[0]
    dataset = load_dataset(first.app)
    matches = [
        int(label)
        for row, label in zip(dataset.x_test, dataset.y_test, strict=True)
        if tuple(float(v) for v in row) == first.features
    ]
    assert first.true_label in matches


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("conversation", "expected WORKLOAD=APP"),
        ("chat=llama-2-7b", "unknown workload 'chat'"),
        ("code=", "bad application name"),
        ("code=a,code=b", "mapped twice"),
        (",", "got nothing"),
    ],
)
def test_bad_app_maps_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(PlanError, match=fragment):
        parse_app_map(text)


def test_app_map_defaults_and_overrides() -> None:
    mapping = parse_app_map("conversation=tiny-lm")

    assert mapping[WorkloadType.CONVERSATION] == "tiny-lm"
    assert mapping[WorkloadType.CODE] == "llama-2-13b"
    assert parse_app_map(None)[WorkloadType.CONVERSATION] == "llama-2-7b"


@pytest.mark.parametrize(
    ("mix", "limit", "share", "fragment"),
    [
        ("multimodel", None, 0.5, "not a trace"),
        ("chaos", None, 0.5, "unknown mix"),
        ("llm", 0, 0.5, "--limit"),
        ("mixed", None, 1.5, "--classification-share"),
    ],
)
def test_build_plan_refuses_bad_settings(
    mix: str, limit: int | None, share: float, fragment: str
) -> None:
    trace = resolve_trace("azure-conv-sample")

    with pytest.raises(PlanError, match=fragment):
        build_plan(trace, mix, limit, classification_share=share)
