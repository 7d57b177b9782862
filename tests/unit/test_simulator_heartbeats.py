"""The simulator's heartbeat option: policies decide on the workers as their last
heartbeats showed them, plus what was sent since, as the live placer does."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from switchyard.policies import make_llm_policy
from switchyard.traces import TraceRequest, resolve_trace, scale_load

from research.llm import SimulationConfig, SimulationError, Simulator
from tests.unit.test_simulate_command import assert_one_line_error
from tests.unit.test_simulate_command import simulate as run_cli
from tests.unit.test_simulator import Row


def served_on(policy: str, rows: Sequence[Any], **config: Any) -> list[str]:
    simulator = Simulator(make_llm_policy(policy), SimulationConfig(**config))
    simulator.run(rows)
    return [r.served_on for r in sorted(simulator.completed, key=lambda r: r.index)]


def test_between_heartbeats_a_policy_sees_only_what_it_sent() -> None:
    # Every worker finishes its request within a second, long before the next, but no
    # heartbeat comes in this run: join-shortest-queue counts what it sent to each and
    # deals the requests out in turn, as a live placer between two heartbeats does.
    rows = [Row(float(i), 200, 20) for i in range(8)]

    blind = served_on("jsq", rows, workers=4, heartbeat_s=1e6)
    seeing = served_on("jsq", rows, workers=4)

    assert blind == ["w00", "w01", "w02", "w03"] * 2
    assert seeing == ["w00"] * 8  # every worker idle at each arrival: the first wins


def test_a_heartbeat_shows_the_worker_as_it_is_and_clears_what_was_sent() -> None:
    # Heartbeats every 0.5 s: by each arrival (2 s apart) every worker has reported
    # itself idle since the last request was sent, so the first worker wins each time.
    rows = [Row(2.0 * i, 200, 20) for i in range(6)]

    assert served_on("jsq", rows, workers=3, heartbeat_s=0.5) == ["w00"] * 6


@pytest.fixture(scope="module")
def busy_conv() -> Sequence[TraceRequest]:
    return scale_load(resolve_trace("azure-conv-sample"), 10.0).requests


def test_stale_views_change_decisions_and_every_request_still_completes(
    busy_conv: Sequence[TraceRequest],
) -> None:
    fresh = Simulator(make_llm_policy("jsq"), SimulationConfig(workers=4, seed=1))
    heard = Simulator(make_llm_policy("jsq"), SimulationConfig(workers=4, seed=1, heartbeat_s=0.25))
    fresh_metrics = fresh.run(busy_conv)
    heard_metrics = heard.run(busy_conv)

    assert heard_metrics.completed == fresh_metrics.completed == len(busy_conv)
    fresh_places = [r.served_on for r in sorted(fresh.completed, key=lambda r: r.index)]
    heard_places = [r.served_on for r in sorted(heard.completed, key=lambda r: r.index)]
    assert fresh_places != heard_places
    # One seed, one outcome, heartbeats included.
    again = Simulator(make_llm_policy("jsq"), SimulationConfig(workers=4, seed=1, heartbeat_s=0.25))
    again.run(busy_conv)
    assert [r.served_on for r in sorted(again.completed, key=lambda r: r.index)] == heard_places


@pytest.mark.parametrize("policy", ["gaps", "switchyard", "llm-d"])
def test_every_kind_of_policy_runs_on_heartbeats(
    policy: str, busy_conv: Sequence[TraceRequest]
) -> None:
    simulator = Simulator(
        make_llm_policy(policy), SimulationConfig(workers=4, seed=2, heartbeat_s=0.25)
    )
    metrics = simulator.run(busy_conv[:300])
    assert metrics.completed == 300


@pytest.mark.parametrize("decode_at_arrival", [True, False])
def test_heartbeats_with_prefill_and_decode_pools(decode_at_arrival: bool) -> None:
    rows = scale_load(resolve_trace("azure-conv-sample"), 10.0).requests[:200]
    config = SimulationConfig(
        workers=4, prefill_workers=1, decode_at_arrival=decode_at_arrival, heartbeat_s=0.25
    )
    assert Simulator(make_llm_policy("jsq"), config).run(rows).completed == 200


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, True])
def test_a_heartbeat_that_is_not_a_positive_period_is_refused(bad: float) -> None:
    with pytest.raises(SimulationError, match="heartbeat must be a positive number"):
        SimulationConfig(workers=2, heartbeat_s=bad)


def test_the_command_takes_heartbeats_and_refuses_a_bad_period(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(
        capsys, "--policies", "jsq", "--requests", "60", "--heartbeat-s", "0.25"
    )
    assert code == 0, err
    assert "heartbeats: policies see each worker as of its last heartbeat, every 0.25 s" in err
    assert "jsq" in out

    code, _, err = run_cli(capsys, "--policies", "jsq", "--heartbeat-s", "0")
    assert_one_line_error(code, err, "--heartbeat-s must be a positive number of seconds")


def test_the_sweep_prints_one_row_per_policy_and_names_a_bad_period(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench.heartbeat_sweep", "--trace", "azure-conv-sample"]
    command += ["--load-scale", "10", "--workers", "2", "--policies", "jsq,switchyard"]
    command += ["--seeds", "1", "--json", str(tmp_path / "sweep.json")]
    done = subprocess.run(
        [*command, "--heartbeats", "none,0.25"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "| policy | every instant: TTFT P99, met | every 0.25 s: TTFT P99, met |" in done.stdout
    assert "| jsq | " in done.stdout
    assert "| switchyard | " in done.stdout
    figures = json.loads((tmp_path / "sweep.json").read_text())["figures"]
    assert [(f["policy"], f["heartbeat_s"]) for f in figures] == [
        ("jsq", None), ("jsq", 0.25), ("switchyard", None), ("switchyard", 0.25)
    ]  # fmt: skip

    bad = subprocess.run(
        [*command, "--heartbeats", "none,0"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 1
    assert bad.stderr.strip() == "--heartbeats: a period must be > 0 seconds, got 0"
