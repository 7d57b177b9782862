"""Admission before assignment: a request no worker can give its first token in time
is refused, naming why; every other is taken."""

from __future__ import annotations

import pytest
from switchyard.policies import PolicyOptions, make_llm_policy
from switchyard.policies.admission import TtftFeasible, make_admission

from tests.unit.test_policies import cluster, request, worker

_PREFILL = {"prefill_per_token_s": 0.0004, "prefill_per_token_sq_s": 0.0}
"""0.4 ms a prompt token: 2,000 tokens take 0.8 s."""


def test_a_prompt_too_long_to_prefill_in_time_anywhere_is_refused() -> None:
    snapshot = cluster(worker("w1", **_PREFILL), worker("w2", **_PREFILL))
    refusal = TtftFeasible().admit(request(prompt_tokens=2000, ttft_slo_s=0.5), snapshot)
    assert refusal is not None
    assert "0.80 s" in refusal.reason
    assert "0.5 s time-to-first-token" in refusal.reason


def test_a_worker_holding_its_prefix_makes_it_feasible() -> None:
    snapshot = cluster(worker("w1", **_PREFILL), worker("w2", **_PREFILL))
    hit = request(prompt_tokens=2000, ttft_slo_s=0.5, cached_tokens={"w2": 1500})
    assert TtftFeasible().admit(hit, snapshot) is None  # 0.2 s past the cached prefix


def test_a_busy_worker_does_not_make_a_feasible_request_refused() -> None:
    # Only what is certain to be late is refused: the wait behind others is not judged.
    busy = worker("w1", waiting=40, queued_tokens=80_000, **_PREFILL)
    assert TtftFeasible().admit(request(prompt_tokens=1000, ttft_slo_s=0.5), cluster(busy)) is None


@pytest.mark.parametrize(
    ("ttft_slo_s", "costs"),
    [(None, _PREFILL), (0.5, {"prefill_per_token_s": 0.0, "prefill_per_token_sq_s": 0.0})],
    ids=["no objective", "prefill cost unknown"],
)
def test_without_an_objective_or_a_prefill_cost_everything_is_taken(
    ttft_slo_s: float | None, costs: dict[str, float]
) -> None:
    snapshot = cluster(worker("w1", **costs))
    assert (
        TtftFeasible().admit(request(prompt_tokens=50_000, ttft_slo_s=ttft_slo_s), snapshot) is None
    )


def test_a_worker_that_prefills_in_chunks_is_judged_on_the_compute_alone() -> None:
    # 1,000 tokens: 0.4 s of compute. In chunks of 64 tokens each iteration adds 10 ms
    # (0.56 s in all), but a prefix cached meanwhile can spare chunks: not certain.
    chunked = worker("w1", prefill_base_s=0.010, chunk_budget_tokens=64, **_PREFILL)
    assert chunked.uncached_prefill_s(1000, 0) == pytest.approx(0.56)
    prompt = request(prompt_tokens=1000, ttft_slo_s=0.5)
    assert TtftFeasible().admit(prompt, cluster(chunked)) is None
    assert (
        TtftFeasible().admit(request(prompt_tokens=1300, ttft_slo_s=0.5), cluster(chunked))
        is not None
    )


def test_slack_widens_what_is_taken() -> None:
    snapshot = cluster(worker("w1", **_PREFILL))
    late = request(prompt_tokens=2000, ttft_slo_s=0.5)
    assert TtftFeasible().admit(late, snapshot) is not None
    assert TtftFeasible(slack=2.0).admit(late, snapshot) is None
    with pytest.raises(ValueError, match="slack must be > 0"):
        TtftFeasible(slack=0.0)


def test_admission_is_a_cluster_option_any_policy_runs_with() -> None:
    assert make_llm_policy("llm-d").admission is None
    assert isinstance(make_llm_policy("switchyard").admission, TtftFeasible)
    with_admission = make_llm_policy("llm-d", PolicyOptions(admission="ttft-feasible"))
    assert isinstance(with_admission.admission, TtftFeasible)
    assert with_admission.reads_cached_tokens
    assert make_llm_policy("switchyard", PolicyOptions(admission="none")).admission is None


def test_an_unknown_admission_policy_is_named_with_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match="unknown admission policy 'strict': known are none, ttft-feasible"
    ):
        PolicyOptions(admission="strict")
    with pytest.raises(ValueError, match="unknown admission policy"):
        make_admission("strict")
