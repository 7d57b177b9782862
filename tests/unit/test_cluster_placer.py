"""The placer's view of the cluster (switchyard.cluster.placer): the latest heartbeats
plus its own decisions since, rebuilt when either changes (views are kept between
decisions, so a stale one would misplace requests)."""

from __future__ import annotations

from switchyard.cluster.placer import LlmPlacer
from switchyard.contracts.messages import Heartbeat, InferenceRequest, LLMPayload
from switchyard.policies.registry import make_llm_policy

from tests.support.services import heartbeat as stored_heartbeat

MODEL = "llama-2-7b"


def heartbeat(worker_id: str, *, queue_length: int = 0, sent_at_s: float = 0.0) -> Heartbeat:
    """A heartbeat naming its inbox partition (a worker without one is sent nothing)."""
    beat = stored_heartbeat(worker_id, waiting=queue_length)
    return beat.model_copy(update={"inbox_partition": int(worker_id[1:]), "sent_at_s": sent_at_s})


def request(request_id: str) -> InferenceRequest:
    payload = LLMPayload(model=MODEL, prompt_tokens=100, max_output_tokens=16)
    return InferenceRequest(request_id=request_id, app="chat", payload=payload, arrival_s=1.0)


def waiting(placer: LlmPlacer) -> dict[str, int]:
    return {w.worker_id: w.waiting for w in placer.cluster(MODEL, now_s=1.0).workers}


def test_decisions_count_until_the_next_heartbeat_and_a_new_heartbeat_is_seen() -> None:
    placer = LlmPlacer(make_llm_policy("jsq"))
    placer.observe(heartbeat("w1"), alive=True)
    placer.observe(heartbeat("w2", queue_length=3), alive=True)
    assert waiting(placer) == {"w1": 0, "w2": 3}
    # Join-shortest-queue: w1 until it holds as many as w2, then both in turn.
    chosen = [placer.place(request(f"r{i}"), now_s=1.0).placement.worker_id for i in range(5)]
    assert chosen[:3] == ["w1", "w1", "w1"]
    assert waiting(placer) == {"w1": 3 + chosen[3:].count("w1"), "w2": 3 + chosen[3:].count("w2")}
    # A heartbeat sent after the decisions replaces them with what the worker says.
    placer.observe(heartbeat("w1", queue_length=1, sent_at_s=2.0), alive=True)
    assert waiting(placer)["w1"] == 1
    # One that is no longer alive is offered to no one.
    placer.observe(heartbeat("w1", queue_length=1, sent_at_s=2.0), alive=False)
    assert {w.worker_id: w.alive for w in placer.cluster(MODEL, now_s=1.0).workers} == {
        "w1": False,
        "w2": True,
    }
    assert placer.place(request("r9"), now_s=1.0).placement.worker_id == "w2"


def test_a_prefix_aware_policy_sends_a_shared_prefix_where_it_sent_it_before() -> None:
    placer = LlmPlacer(make_llm_policy("kv-router"))

    def all_idle(sent_at_s: float) -> None:
        for worker_id in ("w1", "w2", "w3"):
            beat = heartbeat(worker_id, sent_at_s=sent_at_s)
            placer.observe(beat.model_copy(update={"kv_capacity_tokens": 100_000}), alive=True)

    all_idle(0.0)

    def place(request_id: str, blocks: list[int]) -> str:
        payload = LLMPayload(
            model=MODEL, prompt_tokens=4096, max_output_tokens=16, prefix_blocks=blocks
        )
        sent = InferenceRequest(request_id=request_id, app="chat", payload=payload, arrival_s=1.0)
        placed = placer.place(sent, now_s=1.0)
        return placed.placement.worker_id

    first = place("a", [1, 2, 3, 4, 5, 6, 7, 8])
    # Until the workers report again, "a" is load on its worker: a request sharing its
    # prefix costs 2 blocks to prefill + 16 held there, 8 + 8 on an idle worker.
    assert place("b", [1, 2, 3, 4, 5, 6, 40, 41]) != first
    all_idle(2.0)  # "a" and "b" done: the cache stays, the load is gone
    assert place("c", [1, 2, 3, 4, 5, 6, 50, 51]) == first  # 2 + 8 against 8 + 8
