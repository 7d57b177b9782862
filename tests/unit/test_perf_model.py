"""The LLM performance model: named profiles, closed forms, and plausibility against public figures."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from importlib import resources

import pytest
from switchyard.perf import (
    PerformanceModel,
    ProfileDataError,
    UnknownProfileError,
    gpu_profiles,
    model_profiles,
    parse_gpus,
    parse_models,
    performance_model,
    profile_names,
)

A100_7B = "a100-80gb/llama-2-7b"


def _document(filename: str) -> dict[str, object]:
    text = (resources.files("switchyard.perf") / "data" / filename).read_text(encoding="utf-8")
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


# -- profiles --------------------------------------------------------------------------


def test_profiles_cover_three_gpus_and_three_llama_2_sizes() -> None:
    assert {"a100-80gb", "h100-80gb", "l40s-48gb"} <= set(gpu_profiles())
    assert {"llama-2-7b", "llama-2-13b", "llama-2-70b"} <= set(model_profiles())
    names = profile_names()
    assert names == sorted(names)
    assert A100_7B in names
    assert "h100-80gb/llama-2-13b" in names


def test_every_profile_loads_and_holds_more_than_one_prefill_budget() -> None:
    for name in profile_names():
        perf = performance_model(name)
        assert perf.name == name == f"{perf.gpu}/{perf.model}"
        assert perf.kv_capacity_tokens > perf.max_batched_tokens
        assert 1 <= perf.max_batch_slots <= 256
        assert perf.sources
        assert performance_model(name) is perf  # built once


def test_kv_bytes_per_token_follow_the_model_configs() -> None:
    models = model_profiles()
    # 2 (K and V) x 32 layers x 32 heads x 128 x 2 bytes.
    assert models["llama-2-7b"].kv_bytes_per_token == 524_288
    assert models["llama-2-13b"].kv_bytes_per_token == 819_200
    # Grouped-query attention: 8 KV heads for 64 query heads.
    assert models["llama-2-70b"].kv_bytes_per_token == 327_680
    assert performance_model(A100_7B).kv_bytes(1000) == 524_288_000


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "kv_dim", "intermediate"),
    [
        ("llama-2-7b", 32, 4096, 4096, 11008),
        ("llama-2-13b", 40, 5120, 5120, 13824),
        ("llama-2-70b", 80, 8192, 1024, 28672),
    ],
)
def test_parameter_counts_match_the_architecture(
    name: str, layers: int, hidden: int, kv_dim: int, intermediate: int
) -> None:
    vocab = 32_000
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * intermediate + 2 * hidden
    model = model_profiles()[name]
    assert model.parameters == 2 * vocab * hidden + layers * per_layer + hidden
    assert model.weight_bytes == 2 * model.parameters


def test_tensor_parallelism_is_the_smallest_that_fits() -> None:
    assert performance_model(A100_7B).tensor_parallel == 1
    assert performance_model("l40s-48gb/llama-2-13b").tensor_parallel == 1
    # 138 GB of weights: two 80 GB GPUs would leave under 10 % for KV cache.
    assert performance_model("a100-80gb/llama-2-70b").tensor_parallel == 4
    assert performance_model("h100-80gb/llama-2-70b").tensor_parallel == 4


def test_unknown_profile_names_the_choices() -> None:
    with pytest.raises(UnknownProfileError) as caught:
        performance_model("b200/llama")
    message = str(caught.value)
    assert "'b200/llama'" in message
    assert "\n" not in message
    for name in profile_names():
        assert name in message
    assert isinstance(caught.value, ValueError)


# -- plausibility against public figures -------------------------------------------------
# Loose bands: the model is analytical, these only catch a constant that is off by a
# factor. NVIDIA's NeMo Llama-2 figures (batch 1, 128 in / 20 out) are 234 ms on A100
# and 153.8 ms on H100; TensorRT-LLM's A100 LLaMA-7B first token is 16 ms at 128
# tokens and 133 ms at 2,048.


def test_llama_2_7b_on_a100_is_in_the_published_range() -> None:
    perf = performance_model(A100_7B)
    assert 0.008 <= perf.decode_step_s(1, 1001) <= 0.015
    assert 0.050 <= perf.prefill_s([1000]) <= 0.150
    assert 0.200 <= perf.idle_service_s(128, 20) <= 0.280
    assert 0.100 <= perf.prefill_s([2048]) <= 0.200
    # vLLM start-up logs for this pair show of the order of 7,000-7,500 16-token blocks.
    assert 100_000 <= perf.kv_capacity_tokens <= 130_000


def test_h100_is_faster_than_a100_and_13b_slower_than_7b() -> None:
    for model in ("llama-2-7b", "llama-2-13b", "llama-2-70b"):
        a100 = performance_model(f"a100-80gb/{model}")
        h100 = performance_model(f"h100-80gb/{model}")
        assert h100.decode_step_s(1, 1001) < a100.decode_step_s(1, 1001)
        assert h100.decode_step_s(32, 32_000) < a100.decode_step_s(32, 32_000)
        assert h100.prefill_s([1000]) < a100.prefill_s([1000])
    assert 0.130 <= performance_model("h100-80gb/llama-2-7b").idle_service_s(128, 20) <= 0.180
    for gpu in ("a100-80gb", "h100-80gb", "l40s-48gb"):
        small = performance_model(f"{gpu}/llama-2-7b")
        large = performance_model(f"{gpu}/llama-2-13b")
        assert large.decode_step_s(1, 1001) > small.decode_step_s(1, 1001)
        assert large.prefill_s([1000]) > small.prefill_s([1000])
        assert large.kv_capacity_tokens < small.kv_capacity_tokens


# -- behaviour of the formulas -----------------------------------------------------------


def test_more_prompt_tokens_take_longer() -> None:
    perf = performance_model(A100_7B)
    times = [perf.prefill_s([p]) for p in (1, 10, 100, 1000, 4000)]
    assert times == sorted(times)
    assert len(set(times)) == len(times)
    # Attention is quadratic per prompt: one long prompt costs more than its halves.
    assert perf.prefill_s([4000]) > perf.prefill_s([2000, 2000])
    assert perf.prefill_s([]) == 0.0


def test_bigger_batches_take_longer_per_step_but_yield_more_tokens_per_second() -> None:
    perf = performance_model(A100_7B)
    batches = (1, 2, 8, 32, 128, 256)
    steps = [perf.decode_step_s(n, 500 * n) for n in batches]
    assert steps == sorted(steps)
    throughput = [n / step for n, step in zip(batches, steps, strict=True)]
    assert throughput == sorted(throughput)
    assert perf.decode_step_s(8, 10_000) > perf.decode_step_s(8, 1_000)
    assert perf.decode_step_s(0, 0) == 0.0


def test_decode_steps_equal_the_sum_of_single_steps() -> None:
    rng = random.Random(7)
    for name in profile_names():
        perf = performance_model(name)
        for _ in range(20):
            batch = rng.randint(1, perf.max_batch_slots)
            kv = rng.randint(batch, 200_000)
            count = rng.randint(0, 300)
            expected = sum(perf.decode_step_s(batch, kv + i * batch) for i in range(count))
            assert perf.decode_steps_s(batch, kv, count) == pytest.approx(expected, rel=1e-9)
    assert performance_model(A100_7B).decode_steps_s(0, 100, 10) == 0.0


def test_steps_within_is_the_exact_inverse() -> None:
    rng = random.Random(11)
    for name in profile_names():
        perf = performance_model(name)
        for _ in range(200):
            batch = rng.randint(1, perf.max_batch_slots)
            kv = rng.randint(0, 300_000)
            budget = rng.choice([rng.uniform(0.0, 0.1), rng.uniform(0.0, 30.0), 1e4])
            k = perf.steps_within(batch, kv, budget)
            assert perf.decode_steps_s(batch, kv, k) <= budget
            assert perf.decode_steps_s(batch, kv, k + 1) > budget
        # A budget that is exactly the time of k steps admits k steps.
        for k in (1, 2, 17, 1000):
            assert perf.steps_within(4, 4096, perf.decode_steps_s(4, 4096, k)) == k
    perf = performance_model(A100_7B)
    assert perf.steps_within(1, 10, -1.0) == 0
    assert perf.steps_within(1, 10, 0.0) == 0


def test_idle_service_is_one_prefill_then_decode_steps_of_one() -> None:
    perf = performance_model(A100_7B)
    prompt, output = 700, 120
    expected = perf.prefill_s([prompt]) + sum(
        perf.decode_step_s(1, prompt + 1 + i) for i in range(output - 1)
    )
    assert perf.idle_service_s(prompt, output) == pytest.approx(expected, rel=1e-9)
    assert perf.idle_service_s(prompt, 1) == perf.prefill_s([prompt])
    assert perf.idle_service_s(prompt, output + 1) > perf.idle_service_s(prompt, output)
    assert perf.idle_service_s(prompt + 1, output) > perf.idle_service_s(prompt, output)


def test_kv_transfer_moves_the_bytes_at_the_interconnect_rate() -> None:
    perf = performance_model(A100_7B)
    # 524,288,000 bytes over one 200 Gb/s adapter (25 GB/s).
    assert perf.kv_transfer_s(1000) == pytest.approx(524_288_000 / 25e9)
    # A tensor-parallel instance sends each GPU's shard over that GPU's own adapter.
    big = performance_model("a100-80gb/llama-2-70b")
    assert big.interconnect_bytes_per_s == pytest.approx(4 * 25e9)


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.prefill_s([10, -1]),
        lambda p: p.decode_step_s(-1, 0),
        lambda p: p.decode_step_s(1, -5),
        lambda p: p.decode_steps_s(1, 0, -2),
        lambda p: p.steps_within(0, 0, 1.0),
        lambda p: p.steps_within(1, -1, 1.0),
        lambda p: p.idle_service_s(-3, 10),
        lambda p: p.idle_service_s(3, -10),
        lambda p: p.kv_bytes(-1),
        lambda p: p.kv_transfer_s(-1),
    ],
)
def test_negative_counts_are_refused(call: Callable[[PerformanceModel], object]) -> None:
    perf = performance_model(A100_7B)
    with pytest.raises(ValueError, match="must be"):
        call(perf)


def test_a_model_whose_steps_take_no_time_is_refused() -> None:
    fields = {
        field: getattr(performance_model(A100_7B), field)
        for field in PerformanceModel.__dataclass_fields__
    }
    fields.update(decode_base_s=0.0, decode_per_seq_s=0.0)
    with pytest.raises(ValueError, match="decode step must take time"):
        PerformanceModel(**fields)


# -- data files ----------------------------------------------------------------------------


def test_the_bundled_data_files_parse() -> None:
    gpus = parse_gpus(_document("gpus.json"))
    models = parse_models(_document("models.json"))
    assert set(gpus.gpus) == set(gpu_profiles())
    assert set(models.models) == set(model_profiles())
    assert gpus.engine.gpu_memory_utilization == 0.9


def test_a_missing_field_is_named_with_its_file() -> None:
    document = copy.deepcopy(_document("gpus.json"))
    gpus = document["gpus"]
    assert isinstance(gpus, dict)
    del gpus["a100-80gb"]["hbm_bandwidth_bytes_per_s"]
    with pytest.raises(ProfileDataError) as caught:
        parse_gpus(document, "data/gpus.json")
    message = str(caught.value)
    assert "data/gpus.json" in message
    assert "gpus.a100-80gb.hbm_bandwidth_bytes_per_s" in message
    assert "missing" in message


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("models", "llama-2-7b", "layers"), "32", "must be an integer"),
        (("models", "llama-2-7b", "kv_heads"), 0, "must be at least 1"),
        (("models", "llama-2-7b", "sources"), [], "non-empty list"),
        (("models", "llama-2-7b", "head_dim"), 100, "must divide hidden_size"),
        (("models", "llama-2-7b", "tensor_parallel"), {"a100-80gb": 3}, "power of two"),
        (("models", "llama-2-7b", "layer_count"), 32, "not a known field"),
    ],
)
def test_bad_model_fields_are_named_with_their_file(
    path: tuple[str, ...], value: object, problem: str
) -> None:
    document = copy.deepcopy(_document("models.json"))
    target: object = document
    for key in path[:-1]:
        assert isinstance(target, dict)
        target = target[key]
    assert isinstance(target, dict)
    target[path[-1]] = value
    with pytest.raises(ProfileDataError) as caught:
        parse_models(document, "data/models.json")
    message = str(caught.value)
    assert message.startswith("data/models.json: field '")
    assert ".".join(path[:2]) in message
    assert problem in message


def test_efficiency_shares_above_one_are_refused() -> None:
    document = copy.deepcopy(_document("gpus.json"))
    gpus = document["gpus"]
    assert isinstance(gpus, dict)
    gpus["h100-80gb"]["efficiency"]["prefill_mfu"] = 1.5
    with pytest.raises(ProfileDataError, match=r"gpus\.h100-80gb\.efficiency\.prefill_mfu"):
        parse_gpus(document, "data/gpus.json")
