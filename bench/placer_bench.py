"""What one placement decision costs the process that places (the ingress with direct
dispatch, the scheduler otherwise): :meth:`switchyard.cluster.placer.LlmPlacer.place`
over 2, 8 and 32 live workers whose heartbeats do not change between decisions (as
between two heartbeats, which come every half second while decisions come per request),
policy ``jsq`` and ``gaps``. Medians of five runs of 2,000 decisions, microseconds a
decision. ``python -m bench.placer_bench``.
"""

from __future__ import annotations

import statistics
import time

from switchyard.cluster.placer import LlmPlacer
from switchyard.contracts.messages import Heartbeat, InferenceRequest, LLMPayload
from switchyard.policies.registry import make_llm_policy

MODEL = "llama-2-7b"
DECISIONS = 2_000
RUNS = 5


def _heartbeat(index: int) -> Heartbeat:
    return Heartbeat(
        worker_id=f"w{index}",
        worker_type="a100-80gb",
        sequence=1,
        interval_s=0.5,
        queue_length=0,
        queued_work_s=0.0,
        running=0,
        utilization=0.1,
        servable_models=[MODEL],
        resident_models=[MODEL],
        profile=f"a100-80gb/{MODEL}",
        max_slots=64,
        kv_capacity_tokens=100_000,
        inbox_partition=index,
        sent_at_s=0.0,
    )


def decision_us(policy: str, workers: int) -> float:
    """Median microseconds a decision over ``workers`` workers."""
    placer = LlmPlacer(make_llm_policy(policy))
    payload = LLMPayload(model=MODEL, prompt_tokens=100, max_output_tokens=16)
    request = InferenceRequest(request_id="r", app="chat", payload=payload, arrival_s=1.0)
    runs = []
    for _ in range(RUNS):
        for index in range(workers):  # a fresh heartbeat each: no decisions pending
            placer.observe(_heartbeat(index), alive=True)
        started = time.perf_counter()
        for _ in range(DECISIONS):
            placer.place(request, now_s=1.0)
        runs.append((time.perf_counter() - started) / DECISIONS * 1e6)
    return statistics.median(runs)


def main() -> None:
    print("| policy | workers | us a decision |")
    print("|---|---:|---:|")
    for policy in ("jsq", "gaps"):
        for workers in (2, 8, 32):
            print(f"| {policy} | {workers} | {decision_us(policy, workers):.1f} |", flush=True)


if __name__ == "__main__":
    main()
