"""The live stack over the real Kafka broker and Redis: a mixed trace replayed over HTTP.

Every service runs in this process but talks only through Kafka topics and Redis keys
(each with its own connections, as separate processes would), under a topic and key
prefix of its own.
"""

from __future__ import annotations

from switchyard.config import Settings, load_settings
from switchyard.traces import resolve_trace

from loadgen.mixes import PlannedRequest, build_plan
from loadgen.replay import replay
from loadgen.replay_records import ReplayResult
from loadgen.replay_summary import summarize
from services.embedded import EmbeddedPlan, EmbeddedStack


def _settings(kafka_bootstrap: str, redis_url: str, unique_prefix: str) -> Settings:
    """Every service on the real broker and Redis, under this test's own prefixes."""
    return load_settings(
        {},
        bus="kafka",
        state="redis",
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topic_prefix=f"{unique_prefix}.",
        state_prefix=f"{unique_prefix}:",
        worker_time_scale=20.0,
        log_level="WARNING",
        # Exactly-once delivery is the subject here; refusing load is tested elsewhere.
        admission="off",
    )


async def _replay(
    settings: Settings, stack_plan: EmbeddedPlan, plan: list[PlannedRequest]
) -> tuple[ReplayResult, int]:
    """Replay ``plan`` at x20 through the stack ``stack_plan`` describes, each service on
    its own connections; returns the result and the stack's exit status."""
    stack = EmbeddedStack(settings, stack_plan, over_settings_transports=True)
    await stack.start()
    try:
        result = await replay(plan, stack.url, speedup=20.0, timeout_s=60.0, progress=False)
    finally:
        code = await stack.stop()
    return result, code


async def test_every_request_of_a_mixed_replay_is_answered_once(
    kafka_bootstrap: str, redis_url: str, unique_prefix: str
) -> None:
    settings = _settings(kafka_bootstrap, redis_url, unique_prefix)
    plan = build_plan(resolve_trace("azure-mix-sample"), "mixed", 120, 0, classification_share=0.3)
    result, code = await _replay(
        settings,
        EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b", "h100-80gb/llama-2-13b"), http_port=0),
        plan,
    )
    summary = summarize(result.records, result.duration_s)
    failures = [
        (r.request_id, r.status_code, r.error_message)
        for r in result.records
        if r.status_code != 200
    ]
    assert failures == []
    assert summary.answered_ok == len(plan)
    assert len({r.request_id for r in result.records}) == len(plan)
    # Every answer names the worker that served it, and LLM answers say they are emulated.
    for record in result.records:
        assert record.worker_id
        if record.kind == "llm":
            assert record.emulated is True
    assert code == 0


async def test_a_disaggregated_replay_is_decoded_on_the_decode_pool_and_answered_once(
    kafka_bootstrap: str, redis_url: str, unique_prefix: str
) -> None:
    settings = _settings(kafka_bootstrap, redis_url, unique_prefix)
    a100 = "a100-80gb/llama-2-7b"
    plan = build_plan(resolve_trace("azure-conv-sample"), "llm", 60, 0)
    result, code = await _replay(
        settings,
        # llm-0 prefills every request, hands it to llm-1 or llm-2 over its Kafka inbox
        # partition, the move recorded in Redis first.
        EmbeddedPlan(
            llm_workers=(a100, a100, a100), torch_workers=0, http_port=0, prefill_workers=1
        ),
        plan,
    )
    failures = [
        (r.request_id, r.status_code, r.error_message)
        for r in result.records
        if r.status_code != 200
    ]
    assert failures == []
    assert len({r.request_id for r in result.records}) == len(plan)
    # A one-token answer ends with its prefill; every other is the decode pool's.
    served_by = {r.worker_id for r in result.records if (r.max_tokens or 0) > 1}
    assert served_by == {"llm-1", "llm-2"}
    assert code == 0
