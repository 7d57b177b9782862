"""Named simulation regimes: each builds a valid run, and the paper regime really is
the queueing-dominated one."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
from switchyard.perf import performance_model
from switchyard.policies import make_llm_policy
from switchyard.traces import resolve_trace

from research.llm.regimes import (
    CONTINUOUS_BATCHING,
    PAPER,
    PAPER_POISSON,
    Arrivals,
    OfferedUtilisation,
    Regime,
    UnknownRegimeError,
    load_scale,
    make_simulator,
    mean_queueing_share,
    offered_utilisation,
    performance_models,
    regime,
    regime_names,
    regime_trace,
    simulation_config,
    with_poisson_arrivals,
)


def test_every_name_resolves_and_unknown_names_list_the_known_ones() -> None:
    assert set(regime_names()) >= {"paper", "paper-poisson", "continuous-batching"}
    for name in regime_names():
        assert regime(name).name == name
    with pytest.raises(UnknownRegimeError, match="paper"):
        regime("papr")


@pytest.mark.parametrize("name", ["paper", "paper-poisson", "continuous-batching"])
def test_each_regime_builds_a_valid_config_and_simulator(name: str) -> None:
    r = regime(name)
    config = simulation_config(r, seed=2, predictor_error=0.2)
    assert config.workers == r.workers
    assert config.profiles == (r.profile,)
    assert (config.seed, config.predictor_error) == (2, 0.2)
    simulator = make_simulator(r, make_llm_policy("gaps"), seed=2)
    slots = {inst.perf.max_batch_slots for inst in simulator.instances}
    assert slots == {performance_models(r)[0].max_batch_slots}
    assert len(simulator.instances) == r.workers


def test_the_paper_regime_serves_one_request_at_a_time_and_changes_nothing_else() -> None:
    (paper,) = performance_models(PAPER)
    (batching,) = performance_models(CONTINUOUS_BATCHING)
    assert paper.max_batch_slots == 1
    assert batching == performance_model(CONTINUOUS_BATCHING.profile)
    assert batching.max_batch_slots > 100
    assert replace(paper, max_batch_slots=batching.max_batch_slots) == batching


def test_regime_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch_slots"):
        replace(PAPER, max_batch_slots=0)
    with pytest.raises(ValueError, match="names no trace"):
        Regime(name="empty", summary="", workers=8, loads={}, requests=10)
    with pytest.raises(UnknownRegimeError, match="no trace"):
        load_scale(PAPER, "mooncake", ())


def test_offered_utilisation_is_rate_times_idle_service_over_slots() -> None:
    rows = with_poisson_arrivals(resolve_trace("poisson:rate_rps=2,requests=400"), seed=1)
    (model,) = performance_models(PAPER)
    mean_s = statistics.fmean(
        model.idle_service_s(r.prompt_tokens, r.output_tokens) for r in rows.requests
    )
    rate_rps = (len(rows) - 1) / rows.requests[-1].arrival_s
    assert offered_utilisation(rows.requests, model, 4) == pytest.approx(rate_rps * mean_s / 4)


def test_more_slots_at_the_one_slot_rate_keep_the_arrivals() -> None:
    rows = resolve_trace("poisson:rate_rps=2,requests=400").requests
    batched = replace(
        PAPER,
        max_batch_slots=4,
        loads={"azure-conv": OfferedUtilisation(0.85, at_slots=1)},
    )
    nominal = replace(batched, loads={"azure-conv": OfferedUtilisation(0.85)})
    assert load_scale(batched, "azure-conv", rows) == pytest.approx(
        load_scale(PAPER, "azure-conv", rows)
    )
    assert load_scale(nominal, "azure-conv", rows) == pytest.approx(
        4 * load_scale(PAPER, "azure-conv", rows)
    )


def test_poisson_arrivals_keep_the_requests_and_their_order() -> None:
    trace = resolve_trace("poisson:rate_rps=5,requests=300,seed=3")
    again = with_poisson_arrivals(trace, seed=7)
    assert [(r.prompt_tokens, r.output_tokens) for r in again.requests] == [
        (r.prompt_tokens, r.output_tokens) for r in trace.requests
    ]
    assert again.requests[0].arrival_s == 0.0
    assert again != with_poisson_arrivals(trace, seed=8)


def _queueing_share(r: Regime, trace: str) -> tuple[float, float]:
    """Queueing share and mean utilisation of one short JSQ run of ``r``."""
    rows = regime_trace(r, trace)
    simulator = make_simulator(r, make_llm_policy("jsq"))
    metrics = simulator.run(rows)
    return mean_queueing_share(simulator.completed), metrics.mean_utilization


def test_the_paper_regime_is_queueing_dominated_and_continuous_batching_is_not() -> None:
    # 800 conversation requests (the full trace's head, or the bundled sample where the
    # full trace is not next to the repository): well under a second for both regimes.
    paper = replace(PAPER_POISSON, requests=800)
    batching = replace(CONTINUOUS_BATCHING, requests=800)
    paper_share, paper_util = _queueing_share(paper, "azure-conv")
    batching_share, _ = _queueing_share(batching, "azure-conv")
    # Under continuous batching a request starts at once; in the paper regime a large
    # part of its latency is spent waiting behind others.
    assert batching_share < 0.02
    assert paper_share > 0.25
    assert paper_share > 10 * batching_share
    # The regime asks for 85 % of capacity and the workers are busy about that much.
    assert paper_util == pytest.approx(0.85, abs=0.1)


def test_the_paper_regime_runs_at_its_named_load() -> None:
    rows = regime_trace(replace(PAPER, requests=1000), "azure-conv")
    (model,) = performance_models(PAPER)
    assert offered_utilisation(rows, model, PAPER.workers) == pytest.approx(0.85)
    assert PAPER_POISSON.arrivals is Arrivals.POISSON
