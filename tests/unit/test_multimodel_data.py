"""The data side of multi-model scheduling: registry pipelines, clusters, workloads."""

from __future__ import annotations

import copy
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from switchyard.apps.pipelines import (
    InvalidPipelineError,
    UnplaceableModelError,
    catalogue_from_registry,
    check_pipelines,
    check_placeable,
)
from switchyard.apps.registry import Registry, RegistryError
from switchyard.apps.registry_file import load_registry, save_registry
from switchyard.multimodel.dag import critical_path_s, find_cycle
from switchyard.multimodel.model import ModelSpec, PipelineSpec, ResourceVector, Stage, WorkerSpec

from research.multimodel.cluster import (
    ALIBABA_NODE_SAMPLE,
    GPU_SPEEDS,
    TRACE_DIR_ENV,
    TraceFileError,
    alibaba_cluster,
    read_alibaba_nodes,
    synthetic_cluster,
)
from research.multimodel.workload import LORA_SAMPLE, lora_workload, synthetic_workload


def _model(cpu: float, gpu: float, mem: float, exec_s: float = 0.5) -> dict[str, Any]:
    return {"resources": {"cpu": cpu, "gpu": gpu, "mem_gib": mem}, "load_s": 5, "exec_s": exec_s}


def _multimodel() -> dict[str, Any]:
    return {
        "models": {
            "encoder": _model(1, 0.25, 4, 0.1),
            "sd15": _model(2, 0.5, 16, 2.0),
            "esrgan": _model(2, 0.5, 8, 1.0),
        },
        "pipelines": [
            {
                "name": "txt2img",
                "slo_s": 20,
                "stages": [
                    {"name": "encode", "model": "encoder"},
                    {"name": "generate", "model": "sd15", "after": ["encode"]},
                    {"name": "upscale", "model": "esrgan", "after": ["generate"]},
                    {"name": "check", "model": "encoder", "after": ["generate"]},
                ],
            },
            {"name": "plain", "slo_s": 8, "stages": [{"name": "generate", "model": "sd15"}]},
        ],
    }


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "apps.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


WORKERS = (
    WorkerSpec(worker_id="a", gpu_type="T4", capacity=ResourceVector(16, 2, 64)),
    WorkerSpec(worker_id="b", gpu_type="V100M32", capacity=ResourceVector(32, 4, 128), speed=2),
)


def test_multimodel_registry_round_trips(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, _multimodel()))
    assert registry.applications == ()
    assert registry.pipeline_names() == ("txt2img", "plain")
    save_registry(registry, tmp_path / "again.json")
    on_disk = json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))
    assert "applications" not in on_disk
    assert load_registry(tmp_path / "again.json") == registry
    save_registry(registry, tmp_path / "again.yaml")
    assert load_registry(tmp_path / "again.yaml") == registry

    models, pipelines = catalogue_from_registry(registry, WORKERS)
    assert models["sd15"] == ModelSpec(
        name="sd15", resources=ResourceVector(2, 0.5, 16), load_s=5, exec_s=2.0
    )
    txt2img = pipelines["txt2img"]
    assert txt2img.stages[2] == Stage(name="upscale", model="esrgan", after=("generate",))
    assert txt2img.models() == ("encoder", "sd15", "esrgan")
    assert critical_path_s(txt2img, models) == pytest.approx(0.1 + 2.0 + 1.0)
    check_pipelines(models, pipelines)


def _stages(data: dict[str, Any]) -> list[dict[str, Any]]:
    stages: list[dict[str, Any]] = data["pipelines"][0]["stages"]
    return stages


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            lambda d: _stages(d)[0].update(after=["check"]),
            "pipelines[0].stages: cycle encode -> check -> generate -> encode",
            id="cycle",
        ),
        pytest.param(
            lambda d: _stages(d)[1].update(after=["generate"]),
            "pipelines[0].stages: cycle generate -> generate",
            id="self-cycle",
        ),
        pytest.param(
            lambda d: _stages(d)[2].update(model="gpt"),
            "pipelines[0].stages[2].model: unknown model 'gpt'; known: encoder, sd15, esrgan",
            id="unknown-model",
        ),
        pytest.param(
            lambda d: _stages(d)[3].update(after=["generate", "decode"]),
            "pipelines[0].stages[3].after[1]: unknown stage 'decode'; stages: encode, generate",
            id="unknown-after",
        ),
        pytest.param(
            lambda d: _stages(d)[3].update(name="upscale"),
            "pipelines[0].stages[3].name: duplicate stage name 'upscale' (also stages[2])",
            id="duplicate-stage",
        ),
        pytest.param(
            lambda d: d["models"]["sd15"].update(exec_s=0),
            "models.sd15.exec_s: Input should be greater than 0",
            id="zero-exec",
        ),
        pytest.param(
            lambda d: d["models"]["sd15"].update(load_s=-1),
            "models.sd15.load_s: Input should be greater than 0",
            id="negative-load",
        ),
        pytest.param(
            lambda d: d["pipelines"][1].update(slo_s=0),
            "pipelines[1].slo_s: Input should be greater than 0",
            id="zero-slo",
        ),
        pytest.param(
            lambda d: d["pipelines"][1].update(name="txt2img"),
            "pipelines[1].name: duplicate application name 'txt2img' (also pipelines[0])",
            id="duplicate-pipeline",
        ),
        pytest.param(
            lambda d: d.update(pipelines=[]),
            "applications: needs at least one application, pipeline or LLM application",
            id="empty",
        ),
        pytest.param(
            lambda d: d.pop("pipelines"),
            "applications: Field required",
            id="models-only",
        ),
    ],
)
def test_bad_pipelines_are_rejected_by_name(tmp_path: Path, change: Any, expected: str) -> None:
    data = copy.deepcopy(_multimodel())
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(RegistryError) as caught:
        load_registry(path)
    message = str(caught.value)
    assert message.startswith(f"registry {path}: {expected}"), message
    assert "\n" not in message


def test_find_cycle_on_an_acyclic_dag() -> None:
    assert find_cycle({"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}) is None


def test_a_model_bigger_than_every_worker_is_rejected_naming_it() -> None:
    data = _multimodel()
    data["models"]["giant"] = _model(8, 6, 32)
    registry = Registry.model_validate(data)
    with pytest.raises(UnplaceableModelError, match=r"model 'giant' fits on no worker") as caught:
        catalogue_from_registry(registry, WORKERS)
    assert "(cpu 8, gpu 6, mem 32 GiB)" in str(caught.value)
    assert "(cpu 32, gpu 4, mem 128 GiB)" in str(caught.value)
    assert "exceeds the largest worker in gpu" in str(caught.value)
    # Within the per-dimension maxima but on no single worker:
    mixed = {"m": ModelSpec(name="m", resources=ResourceVector(20, 2, 16), load_s=1, exec_s=1)}
    small = (
        WORKERS[0],
        WorkerSpec(worker_id="c", gpu_type="T4", capacity=ResourceVector(32, 1, 64)),
    )
    with pytest.raises(UnplaceableModelError, match="no single worker"):
        check_placeable(mixed, small)


def test_check_pipelines_rejects_a_cycle_built_in_code() -> None:
    models = {"m": ModelSpec(name="m", resources=ResourceVector(1, 0, 1), load_s=1, exec_s=1)}
    stages = (Stage(name="x", model="m", after=("y",)), Stage(name="y", model="m", after=("x",)))
    with pytest.raises(InvalidPipelineError, match=r"'p': cycle x -> y -> x"):
        check_pipelines(models, {"p": PipelineSpec(name="p", stages=stages, slo_s=1)})


def test_alibaba_sample_skips_gpu_less_nodes_and_sets_speeds() -> None:
    nodes = read_alibaba_nodes(ALIBABA_NODE_SAMPLE)
    gpu_nodes = [node for node in nodes if node.gpu > 0]
    assert len(nodes) > len(gpu_nodes) >= 50
    workers = alibaba_cluster(len(gpu_nodes), seed=3, path=ALIBABA_NODE_SAMPLE)
    assert {w.worker_id for w in workers} == {node.sn for node in gpu_nodes}
    assert all(w.capacity.gpu >= 1 for w in workers)
    by_sn = {node.sn: node for node in nodes}
    for worker in workers:
        node = by_sn[worker.worker_id]
        assert worker.capacity == ResourceVector(
            node.cpu_milli / 1000, node.gpu, node.memory_mib / 1024
        )
        assert worker.gpu_type == node.model
        assert worker.speed == GPU_SPEEDS[node.model]
    assert {w.speed for w in workers if w.gpu_type == "T4"} == {1.0}
    assert {w.speed for w in workers if w.gpu_type.startswith("V100")} == {2.0}
    assert alibaba_cluster(10, seed=3, path=ALIBABA_NODE_SAMPLE) == alibaba_cluster(
        10, seed=3, path=ALIBABA_NODE_SAMPLE
    )
    many = alibaba_cluster(100, seed=1, path=ALIBABA_NODE_SAMPLE)
    assert len({w.worker_id for w in many}) == 100


def test_alibaba_heterogeneity_is_the_share_of_slow_workers() -> None:
    workers = alibaba_cluster(20, seed=0, heterogeneity=0.25, path=ALIBABA_NODE_SAMPLE)
    assert sum(w.speed <= 1.3 for w in workers) == 5
    assert all(w.speed > 1.3 for w in alibaba_cluster(8, 0, 0.0, path=ALIBABA_NODE_SAMPLE))


def test_a_configured_trace_dir_without_the_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    with pytest.raises(TraceFileError, match="not found"):
        alibaba_cluster(4, seed=0)
    with pytest.raises(TraceFileError, match="not found"):
        lora_workload()


def test_synthetic_cluster_ratio() -> None:
    workers = synthetic_cluster(10, 0.3, seed=2)
    assert Counter(w.gpu_type for w in workers) == {"T4": 3, "V100M32": 7}
    assert {w.capacity for w in workers} == {ResourceVector(32, 4, 128)}
    assert synthetic_cluster(10, 0.3, seed=2) == workers
    assert all(w.speed == 2.0 for w in synthetic_cluster(4, 0.0, seed=0))
    with pytest.raises(ValueError, match="heterogeneity_ratio"):
        synthetic_cluster(4, 1.5, seed=0)


def test_lora_sample_popularity_exec_scale_and_arrivals() -> None:
    workload = lora_workload(LORA_SAMPLE)
    assert workload.name == "alibaba-lora-sample"
    requests = workload.requests
    arrivals = [r.arrival_s for r in requests]
    assert arrivals[0] == 0.0
    assert arrivals == sorted(arrivals)
    counts = Counter(r.pipeline for r in requests)
    top_share = counts.most_common(1)[0][1] / len(requests)
    assert top_share > 0.2  # one base model takes a large share
    assert top_share > 5 * len(requests) / len(counts) / len(requests)
    scales: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        scales[r.pipeline].append(r.exec_scale)
    for values in scales.values():
        assert statistics.fmean(values) == pytest.approx(1.0)
    for name, pipeline in workload.pipelines.items():
        assert pipeline.stages == (Stage(name="generate", model=name),)
    check_pipelines(workload.models, workload.pipelines)
    assert {m.resources.gpu for m in workload.models.values()} <= {0.5, 1.0}


def test_lora_top_models_and_pipeline_share() -> None:
    workload = lora_workload(LORA_SAMPLE, models=5, pipeline_share=0.3, seed=1)
    base = {r.pipeline.split("-")[0] for r in workload.requests}
    assert len(base) == 5
    multi = sum("-" in r.pipeline for r in workload.requests)
    assert multi == round(0.3 * len(workload.requests))
    check_pipelines(workload.models, workload.pipelines)
    full = next(p for name, p in workload.pipelines.items() if name.endswith("-full"))
    assert [s.after for s in full.stages] == [(), ("encode",), ("generate",), ("generate",)]
    short = lora_workload(LORA_SAMPLE, max_requests=50, time_scale=10)
    assert len(short.requests) == 50


def _window_counts(workload_arrivals: list[float], duration: float, width: float) -> list[int]:
    counts = [0] * int(duration / width)
    for t in workload_arrivals:
        counts[min(int(t / width), len(counts) - 1)] += 1
    return counts


def test_synthetic_workload_is_deterministic_and_fluctuates_as_asked() -> None:
    def make(fluctuation: float, seed: int = 7) -> list[float]:
        workload = synthetic_workload(
            models=6, rate_rps=40, duration_s=600, fluctuation=fluctuation, seed=seed
        )
        return [r.arrival_s for r in workload.requests]

    same = synthetic_workload(models=6, rate_rps=10, duration_s=60, fluctuation=0.5, seed=1)
    again = synthetic_workload(models=6, rate_rps=10, duration_s=60, fluctuation=0.5, seed=1)
    assert same == again
    assert same.requests[0].arrival_s == 0.0

    def cov(arrivals: list[float]) -> float:
        counts = _window_counts(arrivals, 600, 5)
        return statistics.pstdev(counts) / statistics.fmean(counts)

    flat, wavy = make(0.0), make(1.0)
    assert len(flat) == pytest.approx(40 * 600, rel=0.05)
    assert len(wavy) == pytest.approx(40 * 600, rel=0.05)
    assert cov(flat) < 0.15
    assert cov(wavy) > 0.5


def test_invocation_ratio_and_step() -> None:
    workload = synthetic_workload(
        models=9,
        rate_rps=20,
        duration_s=300,
        invocation_ratio=0.3,
        seed=4,
        step_factor=2.0,
        step_at_s=150.0,
    )
    check_pipelines(workload.models, workload.pipelines)
    multi = sum(len(workload.pipelines[r.pipeline].stages) > 1 for r in workload.requests)
    assert multi / len(workload.requests) == pytest.approx(0.3, abs=0.01)
    assert workload.step_at_s == 150.0
    before = sum(r.arrival_s < 150 for r in workload.requests)
    after = len(workload.requests) - before
    assert after / before == pytest.approx(2.0, rel=0.1)
    shapes = {tuple(s.after for s in p.stages) for p in workload.pipelines.values()}
    assert ((), ("s0",), ("s0",)) in shapes  # a shared intermediate
    with pytest.raises(ValueError, match="both or neither"):
        synthetic_workload(models=3, rate_rps=1, duration_s=10, step_factor=2.0)
