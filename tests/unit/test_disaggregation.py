"""Prefill/decode disaggregation as a cluster option (``SimulationConfig.prefill_workers``,
``switchyard simulate --prefill-workers``): off, the simulator is what it was; on, any
policy places each phase over its own pool, and the KV cache's trip is paid."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from switchyard.perf import performance_model
from switchyard.policies import make_llm_policy
from switchyard.policies.base import AssignmentPolicy, DecisionContext, MigrationPlan, Placement
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerRole
from switchyard.traces import TraceRequest, resolve_trace, scale_load

from research.llm import SimulationConfig, SimulationError, Simulator
from research.llm.instance import Phase, SimInstance
from research.llm.request import SimRequest
from tests.unit import test_simulator_golden as golden
from tests.unit.test_simulate_command import assert_one_line_error
from tests.unit.test_simulate_command import simulate as simulate_command
from tests.unit.test_simulator import Row

A100 = "a100-80gb/llama-2-7b"


class Recording(Simulator):
    """The simulator, noting the worker each hand-off left and each migration."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.prefilled_on: list[tuple[int, str]] = []
        self.moves: list[MigrationPlan] = []

    def _handoff(self, request: SimRequest, source: SimInstance, now_s: float) -> None:
        self.prefilled_on.append((request.index, source.worker_id))
        super()._handoff(request, source, now_s)

    def _migrate(self, plan: MigrationPlan, now_s: float) -> None:
        self.moves.append(plan)
        super()._migrate(plan, now_s)


@dataclass
class Watching:
    """An assignment policy that notes what it was shown, then lets ``inner`` decide."""

    inner: AssignmentPolicy
    seen: list[tuple[RequestView, ClusterSnapshot]] = field(default_factory=list)
    name: str = "watching"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        self.seen.append((request, cluster))
        return self.inner.assign(request, cluster, ctx)


@pytest.fixture(scope="module")
def busy_conv() -> Sequence[TraceRequest]:
    # The bundled conversation sample at six times its rate builds queues on 4 workers.
    return scale_load(resolve_trace("azure-conv-sample"), 6.0).requests[:300]


def pools(sim: Simulator) -> tuple[set[str], set[str]]:
    prefill = {i.worker_id for i in sim.instances if i.role is WorkerRole.PREFILL}
    decode = {i.worker_id for i in sim.instances if i.role is WorkerRole.DECODE}
    return prefill, decode


# -- off -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["jsq-conv-x6", "gaps-conv-x6", "splitwise-mixed"])
def test_off_is_the_simulator_as_it_was(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    # Golden cases (a plain policy, a rebalancer, the stage-aware splitwise) with the
    # option given as off explicitly: every request's fate as pinned.
    explicit = functools.partial(SimulationConfig, prefill_workers=None)
    monkeypatch.setattr(golden, "SimulationConfig", explicit)
    digest, summary = golden.outcome(golden.CASES[case])
    assert digest == golden.GOLDEN[case], summary


# -- on --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["jsq", "switchyard", "gaps", "llumnix", "llm-d"])
def test_any_policy_prefills_on_the_prefill_pool_and_decodes_on_the_decode_pool(
    busy_conv: Sequence[TraceRequest], policy: str
) -> None:
    sim = Recording(make_llm_policy(policy), SimulationConfig(workers=4, prefill_workers=2))
    metrics = sim.run(busy_conv)
    prefill, decode = pools(sim)
    assert (len(prefill), len(decode)) == (2, 2)
    assert metrics.completed + metrics.rejected + metrics.refused == metrics.requests == 300
    assert metrics.completed > 250
    # Each completed request was handed off once, from a prefill worker, and finished on
    # a decode worker; nothing is left anywhere.
    handed = Counter(index for index, _ in sim.prefilled_on)
    assert sorted(handed) == sorted(r.index for r in sim.completed)
    assert set(handed.values()) == {1}
    assert {worker for _, worker in sim.prefilled_on} <= prefill
    assert {r.served_on for r in sim.completed} <= decode
    for r in sim.completed:
        assert r.arrival_s <= r.prefill_s < r.first_token_s < r.finished_s
    for inst in sim.instances:
        assert inst.phase is Phase.IDLE
        assert len(inst.waiting) == len(inst.prefilling) == inst.n_running == 0
        assert inst.reserved_tokens == inst.kv_tokens() == 0
    # A rebalancer moves requests within a pool, never across.
    for plan in sim.moves:
        ends = {plan.from_worker_id, plan.to_worker_id}
        assert ends <= prefill or ends <= decode
    if policy == "gaps":  # (Llumnix migrates only at higher loads than this)
        assert sim.moves


def test_the_policy_sees_one_pool_a_decision_and_the_decode_phase_brings_its_kv(
    busy_conv: Sequence[TraceRequest],
) -> None:
    watching = Watching(make_llm_policy("jsq").assignment)
    policy = replace(make_llm_policy("jsq"), assignment=watching)
    sim = Simulator(policy, SimulationConfig(workers=5, prefill_workers=2))
    metrics = sim.run(busy_conv[:100])
    prefill, decode = pools(sim)
    assert metrics.completed == 100
    arrivals = [(r, c) for r, c in watching.seen if r.ttft_slo_s is not None]
    decodes = [(r, c) for r, c in watching.seen if r.ttft_slo_s is None]
    assert len(arrivals) == len(decodes) == 100  # two decisions a request
    for _, cluster in arrivals:
        assert {w.worker_id for w in cluster.workers} == prefill
        assert {w.role for w in cluster.workers} == {WorkerRole.PREFILL}
    for request, cluster in decodes:
        # The decode pool as a plain cluster (every worker eligible), the whole prompt
        # already cached on each of them.
        assert {w.worker_id for w in cluster.eligible()} == decode
        assert {w.role for w in cluster.workers} == {WorkerRole.MIXED}
        assert request.cached_tokens == {w: request.prompt_tokens for w in decode}


@pytest.mark.parametrize("policy", ["jsq", "splitwise"])
def test_the_kv_transfer_counts_in_latency_and_tpot_not_in_ttft(policy: str) -> None:
    perf = performance_model(A100)
    sim = Simulator(make_llm_policy(policy), SimulationConfig(workers=2, prefill_workers=1))
    metrics = sim.run([Row(0.0, 1200, 300)])
    (request,) = sim.completed
    prefill_s = perf.prefill_s((1200,))
    transfer_s = perf.kv_transfer_s(1201)
    decode_s = perf.decode_steps_s(1, 1201, 299)
    assert transfer_s > 0.01
    assert request.first_token_s == pytest.approx(prefill_s, abs=1e-9)
    assert request.finished_s == pytest.approx(prefill_s + transfer_s + decode_s, abs=1e-9)
    assert metrics.ttft_p50_s == pytest.approx(prefill_s, abs=1e-9)
    assert metrics.tpot_p50_s == pytest.approx((transfer_s + decode_s) / 299, abs=1e-9)


@pytest.mark.parametrize("at_arrival", [False, True])
def test_a_one_token_answer_ends_on_its_prefill_worker_with_no_transfer(
    at_arrival: bool,
) -> None:
    # As a live prefill worker ends it: the first token is the answer, so no KV cache
    # travels, and a decode worker chosen on arrival stops counting it.
    perf = performance_model(A100)
    config = SimulationConfig(workers=3, prefill_workers=1, decode_at_arrival=at_arrival)
    sim = Recording(make_llm_policy("jsq"), config)
    metrics = sim.run([Row(0.0, 1200, 1), Row(0.0, 1200, 40)])
    assert metrics.completed == 2
    one, longer = sorted(sim.completed, key=lambda r: r.output_tokens)
    prefill, decode = pools(sim)
    assert one.served_on in prefill
    assert one.finished_s == pytest.approx(one.first_token_s, abs=1e-12)
    assert one.first_token_s <= perf.prefill_s((1200, 1200)) + 1e-9
    assert [index for index, _ in sim.prefilled_on] == [longer.index]
    assert longer.served_on in decode
    assert all(i.incoming == 0 and i.incoming_work_s == pytest.approx(0.0) for i in sim.instances)


def test_the_option_sets_splitwises_pools_and_works_with_chunked_prefill(
    busy_conv: Sequence[TraceRequest],
) -> None:
    own = Simulator(make_llm_policy("splitwise"), SimulationConfig(workers=8))
    assert len(pools(own)[0]) == 2  # its own prefill_fraction, 0.25
    given = Simulator(make_llm_policy("splitwise"), SimulationConfig(workers=8, prefill_workers=5))
    assert len(pools(given)[0]) == 5
    sim = Recording(
        make_llm_policy("jsq"),
        SimulationConfig(workers=4, prefill_workers=2, chunked_prefill_tokens=512),
    )
    metrics = sim.run(busy_conv[:150])
    prefill, decode = pools(sim)
    assert metrics.completed == 150
    assert {worker for _, worker in sim.prefilled_on} <= prefill
    assert {r.served_on for r in sim.completed} <= decode


# -- bad settings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "prefill", "says"),
    [(4, 4, "1 to 3 of 4"), (4, 0, "1 to 3 of 4"), (1, 1, "at least 2 workers"), (4, True, "")],
)
def test_a_pool_left_empty_is_refused(workers: int, prefill: int, says: str) -> None:
    with pytest.raises(SimulationError, match=f"prefill-workers.*{says}"):
        SimulationConfig(workers=workers, prefill_workers=prefill)


def test_the_command_takes_it_and_names_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("--trace", "azure-conv-sample", "--requests", "120", "--policies", "jsq")
    code, _, err = simulate_command(capsys, *common, "--workers", "4,8", "--prefill-workers", "4")
    assert_one_line_error(code, err, "--prefill-workers", "1 to 3 of 4")
    out_file = tmp_path / "capacity.json"
    code, out, err = simulate_command(
        capsys, *common, "--workers", "4", "--prefill-workers", "1", "--capacity",
        "--json", str(out_file),
    )  # fmt: skip
    assert code == 0, err
    assert "disaggregated: 1 workers" in err
    assert "req/s @90%" in out
    document = json.loads(out_file.read_text())
    assert document["config"]["prefill_workers"] == 1


# -- the decode worker chosen on arrival ---------------------------------------------------


def test_on_arrival_both_phases_are_placed_at_once_and_the_decode_worker_counts_it(
    busy_conv: Sequence[TraceRequest],
) -> None:
    watching = Watching(make_llm_policy("jsq").assignment)
    policy = replace(make_llm_policy("jsq"), assignment=watching)
    config = SimulationConfig(workers=5, prefill_workers=2, decode_at_arrival=True)
    sim = Recording(policy, config)
    metrics = sim.run(busy_conv[:100])
    prefill, decode = pools(sim)
    assert metrics.completed == 100
    # Decisions come in pairs, each request's decode phase right after its prefill.
    kinds = ["decode" if r.ttft_slo_s is None else "prefill" for r, _ in watching.seen]
    assert kinds == ["prefill", "decode"] * 100
    ids = [r.request_id for r, _ in watching.seen]
    assert ids[0::2] == ids[1::2]
    assert {r.served_on for r in sim.completed} <= decode
    assert {worker for _, worker in sim.prefilled_on} <= prefill
    # Counted on its decode worker from the choice until it arrived, then no more.
    assert all(i.incoming == 0 and i.incoming_work_s == pytest.approx(0.0) for i in sim.instances)


def test_on_arrival_a_burst_is_spread_over_the_decode_pool() -> None:
    # Four requests at once: join-shortest-queue over the decode pool sees each earlier
    # choice as waiting there, so no decode worker gets two while another has none.
    sim = Simulator(
        make_llm_policy("jsq"),
        SimulationConfig(workers=5, prefill_workers=1, decode_at_arrival=True),
    )
    metrics = sim.run([Row(0.0, 500, 50) for _ in range(4)])
    assert metrics.completed == 4
    assert sorted(r.served_on for r in sim.completed) == ["w01", "w02", "w03", "w04"]


def test_on_arrival_needs_the_pools() -> None:
    with pytest.raises(SimulationError, match="decode-at-arrival needs prefill-workers"):
        SimulationConfig(workers=4, decode_at_arrival=True)


def test_the_command_takes_decode_at_arrival_only_with_the_pools(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ("--trace", "azure-conv-sample", "--requests", "60", "--policies", "jsq")
    code, _, err = simulate_command(capsys, *common, "--workers", "4", "--decode-at-arrival")
    assert_one_line_error(code, err, "--decode-at-arrival needs --prefill-workers")
    code, out, _ = simulate_command(
        capsys, *common, "--workers", "4", "--prefill-workers", "2", "--decode-at-arrival"
    )
    assert code == 0
    assert "jsq" in out
