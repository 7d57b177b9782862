"""The official ``openai`` Python client, unmodified, against the embedded stack: what a
client team's existing code does (completions, chat, streaming with usage, listing and
retrieving models) works, and what the ingress does not support is refused by name
with OpenAI's error shape, never silently ignored."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionFunctionToolParam
from switchyard.config import load_settings

from services.embedded import EmbeddedPlan, EmbeddedStack

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-2-7b"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[AsyncOpenAI]:
    # Real time (scale 1): a decode step lasts longer than the emulation's pacing quantum,
    # so a stream carries a chunk per token, as a real engine sends them.
    settings = load_settings({}, worker_time_scale=1.0, log_level="WARNING")
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=0, http_port=0)
    stack = EmbeddedStack(settings, plan)
    await stack.start()
    # Auth is off in this stack: the client still sends its key, as it always does.
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0) as api:
        yield api
    assert await stack.stop() == 0


async def test_a_completion(client: AsyncOpenAI) -> None:
    answer = await client.completions.create(model=MODEL, prompt="Tell me a story", max_tokens=8)
    assert answer.object == "text_completion"
    assert answer.model == MODEL
    (choice,) = answer.choices
    assert choice.text
    assert choice.finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 8


async def test_a_chat_completion(client: AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=6
    )
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 6


async def test_a_streamed_chat_comes_a_token_at_a_time_with_usage_only_when_asked(
    client: AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream to me"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) >= 12  # one chunk per engine step: inter-token latency is measurable
    with_usage = [c for c in chunks if c.usage is not None]
    assert with_usage == [chunks[-1]]  # the separate last chunk, as the API sends it
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    plain = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "again"}], max_tokens=3, stream=True
    )
    assert [chunk.usage async for chunk in plain if chunk.usage is not None] == []


async def test_models_are_listed_and_retrieved(client: AsyncOpenAI) -> None:
    listed = {model.id async for model in client.models.list()}
    assert MODEL in listed
    model = await client.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 2), ("logprobs", 2), ("echo", True), ("best_of", 3), ("suffix", "end")],
)
async def test_an_unsupported_completion_field_is_refused_by_name(
    client: AsyncOpenAI, field: str, value: object
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        # Sent as the client sends any field it knows (extra_body merges into the body).
        await client.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={field: value}
        )
    assert refused.value.param == field
    assert field in refused.value.message


async def test_tools_and_response_formats_are_refused_by_name(client: AsyncOpenAI) -> None:
    tool: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=[tool],
        )
    assert refused.value.param == "tools"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_object"},
        )
    assert refused.value.param == "response_format"


async def test_an_unknown_model_is_not_found(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.completions.create(model="gpt-nothing", prompt="x", max_tokens=2)
    assert missing.value.code == "model_not_found"
    assert "llama-2-7b" in missing.value.message  # it names the models it serves
