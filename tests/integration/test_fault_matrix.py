"""The fault matrix, shortened: the faults that test the request's life hardest, each
during a replay of a few hundred requests on real processes, a broker and a Redis of
this module's own (``make faults`` runs every kind on 10,000 requests).

For each: nothing accepted is lost (every call without an answer, retried with its id,
gets one), no refusal was false (a refused call left nothing in the ledger, and none
said no worker was alive), answered calls retried get the same answer, no request was
answered by two runs, and none ran twice but what a frozen or cut-off worker held when
it was declared down.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.harness.fault_run import FaultRunConfig, run_fault
from loadgen.harness.faults import FAULTS
from loadgen.harness.infra import PrivateInfra
from loadgen.harness.network_cut import unavailable

CONFIG = FaultRunConfig(requests=400, rate_rps=40.0, retry_answered=10)
LONGER = {"broker-kill": 1_500, "redis-empty": 1_200}
"""A killed broker takes about 15 s to recover its log and answer again, and a Redis that
came back empty is restored from the topics for up to several seconds on a busy machine
(calls meanwhile get 503 ``state_restoring``): the replay must outlast either for the
stack's recovery to be seen."""


@pytest.fixture(scope="module")
def infra() -> Iterator[PrivateInfra]:
    servers = PrivateInfra()
    servers.start()
    yield servers
    servers.stop()


@pytest.mark.parametrize(
    "fault",
    [
        "worker-freeze",
        "worker-cut",
        "models-worker-kill",
        "ingress-kill",
        "scheduler-freeze",
        "monitor-kill",
        "estimator-kill",
        "broker-kill",
        "redis-kill",
        "redis-empty",
    ],
)
async def test_a_fault_during_a_replay_loses_doubles_and_reruns_nothing(
    infra: PrivateInfra, fault: str, tmp_path: Path
) -> None:
    if fault == "worker-cut" and (reason := unavailable()) is not None:
        pytest.fail(f"the network cut cannot be made here: {reason}")
    config = dataclasses.replace(CONFIG, requests=LONGER.get(fault, CONFIG.requests))
    report = await run_fault(infra, FAULTS[fault], config, f"t{uuid.uuid4().hex[:8]}", tmp_path)
    detail = json.dumps(report.to_json(), indent=1)[:6000]
    assert report.requests == config.requests, detail
    assert report.classification_calls > 0 or FAULTS[fault].classification_share == 0, detail
    assert report.pipeline_calls > 0 or FAULTS[fault].pipeline_share == 0, detail
    assert report.lost == [], detail
    assert report.refused_then_run == [], detail
    assert report.answers_differ == [], detail
    # No request was answered by two runs; one ran twice only when a frozen or cut-off
    # worker ran on what it held after it was declared down (its answer refused).
    assert report.answered_by_two_runs == [], detail
    assert set(report.ran_twice) <= set(report.ran_twice_held), detail
    # Live workers are never refused as missing: not even while the broker is away and
    # their heartbeats cannot get through (every fault here leaves some worker alive).
    assert not [kind for kind in report.failures_by_kind if "no_worker" in kind], detail
    assert report.answered_retries == config.retry_answered, detail
    # The fault happened, during the replay, and the stack answered after it.
    assert report.events, detail
    assert report.recovery_s is not None, detail
