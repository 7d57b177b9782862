"""The prefix-aware baselines (llm-d's endpoint picker, Dynamo's KV router) over
hand-built snapshots: a prefix hit draws a request, until load outweighs it."""

from __future__ import annotations

import pytest
from switchyard.policies import make_llm_policy
from switchyard.policies.prefix_aware import EndpointPicker, KvRouter

from tests.unit.test_policies import cluster, ctx, request, worker


def test_the_endpoint_picker_follows_the_prefix_among_equally_loaded_workers() -> None:
    snapshot = cluster(worker("w1"), worker("w2"), worker("w3"))
    placed = EndpointPicker().assign(
        request(prompt_tokens=2000, cached_tokens={"w2": 1536}), snapshot, ctx()
    )
    assert placed.worker_id == "w2"


def test_the_endpoint_picker_leaves_a_prefix_behind_a_long_queue_and_a_full_cache() -> None:
    # w1 holds 3/4 of the prompt (3 x 0.75 = 2.25 points) but has the longest queue and a
    # full KV cache (0 + 0 points); w2 is idle and empty (2 + 2 points).
    snapshot = cluster(
        worker("w1", waiting=10, kv_used_tokens=100_000), worker("w2"), worker("w3", waiting=5)
    )
    placed = EndpointPicker().assign(
        request(prompt_tokens=2048, cached_tokens={"w1": 1536}), snapshot, ctx()
    )
    assert placed.worker_id == "w2"


def test_the_kv_router_weighs_blocks_to_prefill_against_blocks_held() -> None:
    # w1 would prefill 1 block of 8 but holds 20 blocks; w2 prefills all 8 and holds none:
    # cost 1 + 20 + 8 = 29 against 8 + 0 + 8 = 16.
    busy_but_cached = cluster(worker("w1", queued_tokens=20 * 512), worker("w2"))
    placed = KvRouter().assign(
        request(prompt_tokens=8 * 512, cached_tokens={"w1": 7 * 512}), busy_but_cached, ctx()
    )
    assert placed.worker_id == "w2"
    lightly_loaded = cluster(worker("w1", queued_tokens=2 * 512), worker("w2"))
    placed = KvRouter().assign(
        request(prompt_tokens=8 * 512, cached_tokens={"w1": 7 * 512}), lightly_loaded, ctx()
    )
    assert placed.worker_id == "w1"  # 1 + 2 + 8 = 11 against 16


@pytest.mark.parametrize("name", ["llm-d", "kv-router"])
def test_without_prefix_knowledge_they_balance_load(name: str) -> None:
    policy = make_llm_policy(name).assignment
    snapshot = cluster(
        worker("w1", waiting=4, queued_tokens=8000, kv_used_tokens=6000),
        worker("w2", waiting=1, queued_tokens=2000, kv_used_tokens=1500),
    )
    assert policy.assign(request(), snapshot, ctx()).worker_id == "w2"


def test_switchyard_follows_a_prefix_as_far_as_the_prefill_it_spares() -> None:
    policy = make_llm_policy("switchyard").assignment
    # 1 s of predicted service; the cached prefix spares w1 0.6 s of prefill.
    costs = {"prefill_per_token_s": 0.6 / 1500, "prefill_per_token_sq_s": 0.0}
    hit = request(service_s=1.0, prompt_tokens=2000, cached_tokens={"w1": 1500})
    shorter_by_half = cluster(worker("w1", queued_work_s=0.5, **costs), worker("w2", **costs))
    assert policy.assign(hit, shorter_by_half, ctx()).worker_id == "w1"  # 0.9 against 1.0
    shorter_by_one = cluster(worker("w1", queued_work_s=1.0, **costs), worker("w2", **costs))
    assert policy.assign(hit, shorter_by_one, ctx()).worker_id == "w2"  # 1.4 against 1.0


def test_switchyard_without_a_prediction_counts_tokens() -> None:
    policy = make_llm_policy("switchyard").assignment
    bare = request(prompt_tokens=2000, cached_tokens={"w1": 1500}, calibrated_s={})
    snapshot = cluster(worker("w1", queued_tokens=1000), worker("w2"))
    assert policy.assign(bare, snapshot, ctx()).worker_id == "w1"  # 1,500 against 2,000
