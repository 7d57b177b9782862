"""An LLM stage on the real torch language model, end to end on the embedded stack: a
registry pipeline whose draft the tiny model writes and then judges (``choices``), so
the branch taken is the model's own verdict, computed by a forward pass."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from switchyard.config import load_settings
from switchyard.serving import TINY_LM_MODEL

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.worker.backends.torch_lm import TinyLmConfig, build_tiny_lm, choose_label, generate

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


async def test_the_torch_model_drafts_judges_its_draft_and_the_verdict_picks_the_branch(
    stack: EmbeddedStack,
) -> None:
    model = build_tiny_lm(TinyLmConfig(), "cpu")
    inputs = ["Is 7 prime?", "Name a colour.", "2 + 2 =", "Spell cat.", "Why?", "Say hi."]
    verdicts = set()
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        for i, text in enumerate(inputs):
            answer = await client.post(
                "/v1/apps/tiny-draft-verify/infer", json={"input": text, "request_id": f"t-{i}"}
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["emulated"] is False
            stages = {s["stage"]: s for s in body["stages"]}
            assert stages["draft"]["worker_id"] == "torch-0"
            # The draft is the model's greedy continuation of the input (bytes in, bytes
            # out), and the verdict its most likely label after input and draft.
            draft = generate(model, [text.encode()], 12)[0].decode("utf-8", errors="replace")
            prompt = f"{text}\n\ndraft: {draft}"
            verdict = choose_label(model, prompt.encode(), ["accept", "reject"])
            assert stages["verify"]["label"] == verdict
            verdicts.add(verdict)
            if verdict == "accept":
                assert body["output"] == {"draft": draft}
                assert body["skipped"] == ["revise"]
            else:
                assert list(body["output"]) == ["revise"]
                assert stages["revise"]["worker_id"] == "torch-0"
    # Random weights judge arbitrarily, but not all alike: both branches were taken.
    assert verdicts == {"accept", "reject"}
