"""The live stack over the real Kafka broker and Redis: a mixed trace replayed over HTTP.

Every service runs in this process but talks only through Kafka topics and Redis keys
(each with its own connections, as separate processes would), under a topic and key
prefix of its own.
"""

from __future__ import annotations

from switchyard.config import load_settings
from switchyard.traces import resolve_trace

from loadgen.mixes import build_plan
from loadgen.replay import replay
from loadgen.replay_summary import summarize
from services.embedded import EmbeddedPlan, EmbeddedStack


async def test_every_request_of_a_mixed_replay_is_answered_once(
    kafka_bootstrap: str, redis_url: str, unique_prefix: str
) -> None:
    settings = load_settings(
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
    plan = build_plan(resolve_trace("azure-mix-sample"), "mixed", 120, 0, classification_share=0.3)
    stack = EmbeddedStack(
        settings,
        EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b", "h100-80gb/llama-2-13b"), http_port=0),
        over_settings_transports=True,
    )
    await stack.start()
    try:
        result = await replay(plan, stack.url, speedup=20.0, timeout_s=60.0, progress=False)
    finally:
        code = await stack.stop()
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
