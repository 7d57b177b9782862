"""The torch backends: the tiny language model really generates; the classifier serves the
registry's variants through the model cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from switchyard.apps.profiling import build_registry
from switchyard.apps.registry_file import save_registry
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    ClassificationResult,
    InferenceRequest,
    LLMPayload,
    LLMResult,
)
from switchyard.serving import TINY_LM_MODEL, ServingCatalogue

from services.worker.backends.base import UnsupportedWorkError
from services.worker.backends.classifier import ClassifierRunner
from services.worker.backends.static import StaticBatchBackend
from services.worker.backends.torch_lm import (
    BOS,
    TinyLm,
    TinyLmConfig,
    TinyLmRunner,
    build_tiny_lm,
    choose_label,
    generate,
    resolve_device,
)
from services.worker.model_cache import ModelCache
from services.worker.queue import LocalQueue, WorkItem
from tests.support.worker import Sink


def _assign(request: InferenceRequest, variant: str, order: float = 0.0) -> Assignment:
    return Assignment(
        request=request, worker_id="w1", variant=variant, order=order, policy="t", assigned_at_s=1.0
    )


def _llm(request_id: str, prompt: str | None, output: int, prompt_tokens: int = 8) -> Assignment:
    payload = LLMPayload(
        model=TINY_LM_MODEL, prompt_tokens=prompt_tokens, max_output_tokens=output, prompt=prompt
    )
    return _assign(
        InferenceRequest(request_id=request_id, app=TINY_LM_MODEL, payload=payload, arrival_s=0.5),
        TINY_LM_MODEL,
    )


def _classify(request_id: str, features: list[float], variant: str, order: float = 0) -> Assignment:
    request = InferenceRequest(
        request_id=request_id,
        app="digits",
        payload=ClassificationPayload(features=features),
        arrival_s=0.5,
    )
    return _assign(request, variant, order)


def _enqueue(backend: StaticBatchBackend, queue: LocalQueue, assignment: Assignment) -> WorkItem:
    spec = backend.describe(assignment)
    item = WorkItem(
        assignment=assignment,
        key=spec.key,
        received_at_s=1.0,
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        estimate_s=spec.estimate_s,
    )
    queue.push(item)
    return item


# -- the tiny language model ----------------------------------------------------------------


def test_tiny_lm_generates_deterministically_from_real_computation() -> None:
    model = build_tiny_lm(TinyLmConfig(), "cpu")
    assert next(model.parameters()).device.type == "cpu"
    prompts = [b"hello world", b"a rather different prompt, longer", b""]
    first = generate(model, prompts, 12)
    again = generate(build_tiny_lm(TinyLmConfig(), "cpu"), prompts, 12)
    assert first == again  # fixed seed, greedy: the same bytes every time
    assert [len(out) for out in first] == [12, 12, 12]
    assert len(set(first)) == 3  # the prompt changes the output
    # Batching does not change a prompt's output (left padding is masked out).
    assert generate(model, [prompts[1]], 12) == [first[1]]
    # Another seed is another model.
    assert generate(build_tiny_lm(TinyLmConfig(seed=1), "cpu"), prompts, 12) != first


def test_resolve_device() -> None:
    assert resolve_device("cpu") == "cpu"
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == expected
    if not torch.cuda.is_available():
        with pytest.raises(UnsupportedWorkError, match="no CUDA device"):
            resolve_device("cuda")


async def test_tiny_lm_backend_batches_and_streams_text() -> None:
    cache = ModelCache(50_000_000)
    runner = TinyLmRunner(cache, "cpu")
    backend = StaticBatchBackend([runner], cache, worker_type="cpu", max_batch=8)
    queue, sink = LocalQueue(), Sink()
    short = _enqueue(backend, queue, _llm("short", "héllo", 3))
    long = _enqueue(backend, queue, _llm("long", None, 9, prompt_tokens=20))
    assert short.prompt_tokens == len("héllo".encode())  # UTF-8 bytes
    assert long.prompt_tokens == 20  # synthetic bytes
    assert await backend.step(queue, sink, admit=True)
    assert sink.started_ids == ["short", "long"]  # one batch
    assert sink.token_counts == {"short": 3, "long": 9}
    for request_id, want in (("short", 3), ("long", 9)):
        result = sink.results[request_id]
        assert isinstance(result, LLMResult)
        assert result.output_tokens == want
        assert result.text == sink.texts[request_id]  # the streamed text adds up
        assert result.text is not None
        assert len(result.text.encode("utf-8", "replace")) >= 1
    model = build_tiny_lm(TinyLmConfig(), "cpu")
    expected = generate(model, ["héllo".encode()], 3)[0].decode("utf-8", errors="replace")
    assert sink.results["short"] == LLMResult(output_tokens=3, text=expected)
    assert cache.resident() == [TINY_LM_MODEL]
    assert not await backend.step(queue, sink, admit=True)


def _log_prob(model: TinyLm, prompt: bytes, label: bytes) -> float:
    """A label's log-probability after ``prompt``, token by token, unpadded and unbatched."""
    import torch
    from torch.nn import functional

    tokens = torch.tensor([[BOS, *prompt, *label]])
    length = tokens.shape[1]
    mask = torch.ones((length, length), dtype=torch.bool).tril()[None, None]
    with torch.inference_mode():
        logits, _ = model(tokens, torch.arange(length)[None], mask)
        log_probs = functional.log_softmax(logits[0, :, :256].float(), dim=-1)
    start = 1 + len(prompt)
    return sum(float(log_probs[start + i - 1, byte]) for i, byte in enumerate(label))


def test_tiny_lm_chooses_the_label_it_scores_most_likely_after_the_prompt() -> None:
    model = build_tiny_lm(TinyLmConfig(), "cpu")
    picks = set()
    # Labels of different lengths, so the batch is padded; several prompts and sets.
    for prompt in (b"is this draft right?", b"", "caf\u00e9 ok".encode(), b"z" * 40):
        for labels in (["accept", "reject"], ["yes", "no", "maybe"], ["a", "bb", "ccc", "d"]):
            scores = {label: _log_prob(model, prompt, label.encode()) for label in labels}
            chosen = choose_label(model, prompt, labels)
            assert chosen == max(labels, key=scores.__getitem__), (prompt, scores)
            picks.add(chosen)
    assert len(picks) >= 3  # the prompt and the labels decide, not the position


async def test_tiny_lm_backend_answers_a_request_with_choices_by_its_label() -> None:
    cache = ModelCache(50_000_000)
    runner = TinyLmRunner(cache, "cpu")
    backend = StaticBatchBackend([runner], cache, worker_type="cpu", max_batch=8)
    queue, sink = LocalQueue(), Sink()
    judged = _llm("judged", "the draft: 42", 1)
    payload = judged.request.payload.model_copy(update={"choices": {"accept": 0.5, "reject": 0.5}})
    judged = judged.model_copy(
        update={"request": judged.request.model_copy(update={"payload": payload})}
    )
    _enqueue(backend, queue, judged)
    _enqueue(backend, queue, _llm("free", "the draft: 42", 2))
    assert await backend.step(queue, sink, admit=True)
    model = build_tiny_lm(TinyLmConfig(), "cpu")
    label = choose_label(model, b"the draft: 42", ["accept", "reject"])
    assert sink.results["judged"] == LLMResult(output_tokens=1, text=label, label=label)
    free = sink.results["free"]
    assert isinstance(free, LLMResult)
    assert free.label is None
    assert free.output_tokens == 2


def test_tiny_lm_refuses_other_models() -> None:
    runner = TinyLmRunner(ModelCache(50_000_000), "cpu")
    other = _llm("x", "hi", 4).model_copy(
        update={
            "request": InferenceRequest(
                request_id="x",
                app="llama-2-7b",
                payload=LLMPayload(model="llama-2-7b", prompt_tokens=3, max_output_tokens=4),
                arrival_s=0.5,
            )
        }
    )
    with pytest.raises(UnsupportedWorkError, match="tiny-lm"):
        runner.describe(other)


def test_torch_modules_load_only_with_the_torch_backend() -> None:
    import subprocess

    code = (
        "import sys, services.worker, services.worker.service, services.worker.backends;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


# -- the classifier -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> ServingCatalogue:
    folder: Path = tmp_path_factory.mktemp("registry")
    registry = build_registry(folder, seed=0, repeats=1, applications=("digits",))
    save_registry(registry, folder / "registry.json")
    return ServingCatalogue.from_registry(registry, folder)


def _classifier(catalogue: ServingCatalogue, budget: int = 50_000_000) -> StaticBatchBackend:
    cache = ModelCache(budget)
    runner = ClassifierRunner(catalogue, cache, max_batch=16)
    return StaticBatchBackend([runner], cache, worker_type="cpu", max_batch=16)


async def test_classifier_batches_one_variant_and_fails_a_wrong_dimension_alone(
    catalogue: ServingCatalogue,
) -> None:
    app = catalogue.classification["digits"]
    variant = app.variants[-1]
    backend = _classifier(catalogue)
    assert f"digits/{variant}" in backend.servable_models()
    queue, sink = LocalQueue(), Sink()
    dim = app.feature_dim
    _enqueue(backend, queue, _classify("ok-1", [0.0] * dim, variant, order=1))
    _enqueue(backend, queue, _classify("bad", [0.0] * (dim - 1), variant, order=2))
    _enqueue(backend, queue, _classify("ok-2", [1.0] * dim, variant, order=3))
    assert await backend.step(queue, sink, admit=True)
    assert sink.started_ids == ["ok-1", "bad", "ok-2"]
    assert sink.errors == {"bad": f"application 'digits' expects {dim} features, got {dim - 1}"}
    for request_id in ("ok-1", "ok-2"):
        result = sink.results[request_id]
        assert isinstance(result, ClassificationResult)
        assert len(result.probabilities) == len(app.classes)
        assert sum(result.probabilities) == pytest.approx(1.0)
        assert result.label == max(
            range(len(result.probabilities)), key=result.probabilities.__getitem__
        )
    assert backend.resident_models() == [f"digits/{variant}"]


async def test_classifier_swaps_models_within_the_budget(catalogue: ServingCatalogue) -> None:
    app = catalogue.classification["digits"]
    sizes = {v: app.spec.variants[v].memory_bytes for v in app.variants}
    smallest, largest = min(sizes, key=sizes.__getitem__), max(sizes, key=sizes.__getitem__)
    # Room for the largest alone: loading it evicts the smallest.
    backend = _classifier(catalogue, budget=sizes[largest] + sizes[smallest] // 2)
    queue, sink = LocalQueue(), Sink()
    dim = app.feature_dim
    _enqueue(backend, queue, _classify("s", [0.0] * dim, smallest, order=1))
    _enqueue(backend, queue, _classify("l", [0.0] * dim, largest, order=2))
    assert await backend.step(queue, sink, admit=True)
    assert backend.resident_models() == [f"digits/{smallest}"]
    assert await backend.step(queue, sink, admit=True)
    assert backend.resident_models() == [f"digits/{largest}"]
    assert set(sink.results) == {"s", "l"}


async def test_classifier_refuses_unknown_apps_and_too_large_models(
    catalogue: ServingCatalogue,
) -> None:
    app = catalogue.classification["digits"]
    backend = _classifier(catalogue)
    with pytest.raises(UnsupportedWorkError, match="has no variant 'nope'"):
        backend.describe(_classify("x", [0.0] * app.feature_dim, "nope"))
    unknown = InferenceRequest(
        request_id="y", app="wine", payload=ClassificationPayload(features=[1.0]), arrival_s=0.5
    )
    with pytest.raises(UnsupportedWorkError, match="unknown application 'wine'"):
        backend.describe(_assign(unknown, "mlp-small"))
    variant = app.variants[-1]
    tiny = _classifier(catalogue, budget=16)
    queue, sink = LocalQueue(), Sink()
    _enqueue(tiny, queue, _classify("big", [0.0] * app.feature_dim, variant))
    assert await tiny.step(queue, sink, admit=True)
    assert "budget of 16 bytes" in sink.errors["big"]
