"""An LLM stage on the real torch language model, end to end on the embedded stack: a
registry pipeline whose draft the tiny model writes and then judges (``choices``), so
the branch taken is the model's own verdict, computed by a forward pass."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from switchyard.config import load_settings
from switchyard.serving import TINY_LM_MODEL

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.worker.backends.torch_lm import (
    TinyLm,
    TinyLmConfig,
    build_tiny_lm,
    choose_label,
    generate,
)

REGISTRY = {
    "pipelines": [
        {
            "name": "tiny-draft-verify",
            "slo_s": 60,
            "stages": [
                {"name": "draft", "llm": TINY_LM_MODEL, "output_tokens": 12},
                {
                    "name": "verify",
                    "llm": TINY_LM_MODEL,
                    "after": ["draft"],
                    "choices": {"accept": 0.5, "reject": 0.5},
                },
                {
                    "name": "revise",
                    "llm": TINY_LM_MODEL,
                    "after": ["draft", "verify"],
                    "when": {"stage": "verify", "label": "reject"},
                    "output_tokens": 8,
                },
            ],
            "answer": ["revise", "draft"],
        }
    ]
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedStack]:
    folder: Path = tmp_path_factory.mktemp("registry")
    (folder / "apps.json").write_text(json.dumps(REGISTRY), encoding="utf-8")
    settings = load_settings(
        {}, registry=str(folder / "apps.json"), log_level="WARNING", heartbeat_interval_s=0.2
    )
    plan = EmbeddedPlan(llm_workers=(), torch_workers=1, model_workers=0, http_port=0)
    embedded = EmbeddedStack(settings, plan)
    await embedded.start()
    try:
        yield embedded
    finally:
        assert await embedded.stop() == 0


pytestmark = pytest.mark.asyncio(loop_scope="module")


@functools.cache
def _model() -> TinyLm:
    return build_tiny_lm(TinyLmConfig(), "cpu")


def _verdict(text: str) -> tuple[str, str]:
    """The draft the tiny model writes for ``text`` (its greedy continuation, bytes in,
    bytes out) and its verdict on it: the likelier label after the input and the draft,
    computed here, on the machine the stack runs on."""
    model = _model()
    draft = generate(model, [text.encode()], 12)[0].decode("utf-8", errors="replace")
    prompt = f"{text}\n\ndraft: {draft}"
    return draft, choose_label(model, prompt.encode(), ["accept", "reject"])


async def test_the_torch_model_drafts_judges_its_draft_and_the_verdict_picks_the_branch(
    stack: EmbeddedStack,
) -> None:
    # Random weights judge arbitrarily (and torch's kernels differ by CPU): pick inputs
    # here for which the model accepts and rejects, so that both branches run.
    candidates = [f"Question {i}: is {i} prime?" for i in range(24)]
    verdicts = {text: _verdict(text) for text in candidates}
    accepted = [t for t in candidates if verdicts[t][1] == "accept"]
    rejected = [t for t in candidates if verdicts[t][1] == "reject"]
    assert accepted, "the model rejects every draft"
    assert rejected, "the model accepts every draft"
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        for i, text in enumerate([*accepted[:2], *rejected[:2]]):
            answer = await client.post(
                "/v1/apps/tiny-draft-verify/infer", json={"input": text, "request_id": f"t-{i}"}
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["emulated"] is False
            stages = {s["stage"]: s for s in body["stages"]}
            assert stages["draft"]["worker_id"] == "torch-0"
            draft, verdict = verdicts[text]
            assert stages["verify"]["label"] == verdict
            if verdict == "accept":
                assert body["output"] == {"draft": draft}
                assert body["skipped"] == ["revise"]
            else:
                assert list(body["output"]) == ["revise"]
                assert stages["revise"]["worker_id"] == "torch-0"
