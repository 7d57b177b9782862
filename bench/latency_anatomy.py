"""Where an unloaded request's time goes, hop by hop, on the stack of processes.

The same stack as :mod:`bench.hot_path_bench` (services as processes on the local Kafka
and Redis, two emulated workers at time scale 100, admission off, direct dispatch) at a
low rate, so that no process queues and what is left is the path itself. After each
rate the assignments and the answers are read back from their topics: a Kafka record's
timestamp is when its producer sent it, on the same clock as the request's timeline, so
each request's time splits into

- **ingress**: arrival at the ingress to the assignment's send (reading the call,
  deciding, recording it in the ledger);
- **to the worker**: the assignment's send to the start on the worker (the Kafka hop,
  the worker's intake, its ledger start);
- **execution**: start to finish (the emulated engine: a performance model's output);
- **recording**: finish to the answer's send (the worker's ledger finish);
- **back to the client**: the rest of the client's latency (the Kafka hop to the
  ingress, routing the answer, the HTTP answer, and the HTTP call's way in).

Medians and P90 in milliseconds. ``python -m bench.latency_anatomy [--rates 25,100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections.abc import Sequence

from switchyard.contracts.messages import Assignment, Completion
from switchyard.contracts.topics import ANSWERS, WORKER_INBOX

from bench.hot_path_bench import RESULTS, running_stack, short_completions, warm_up
from loadgen.harness.process_stack import read_topic
from loadgen.replay import replay
from loadgen.replay_records import OK, RequestRecord

SEGMENTS = ("ingress", "to the worker", "execution", "recording", "back to the client")


def segments_ms(
    records: Sequence[RequestRecord],
    sent_s: dict[str, float],
    answered_s: dict[str, float],
) -> dict[str, list[float]]:
    """Each segment's milliseconds over the answered requests whose assignment send
    time (``sent_s``) and answer send time (``answered_s``) were read back."""
    found: dict[str, list[float]] = {name: [] for name in SEGMENTS}
    for record in records:
        timeline = record.timeline or {}
        rid = record.request_id
        needed = ("arrival_s", "started_s", "finished_s")
        if record.outcome != OK or record.latency_s is None or rid not in sent_s:
            continue
        if rid not in answered_s or any(k not in timeline for k in needed):
            continue
        arrival_s, started_s, finished_s = (timeline[k] for k in needed)
        parts = (
            sent_s[rid] - arrival_s,
            started_s - sent_s[rid],
            finished_s - started_s,
            answered_s[rid] - finished_s,
            record.latency_s - (answered_s[rid] - arrival_s),
        )
        for name, seconds in zip(SEGMENTS, parts, strict=True):
            found[name].append(seconds * 1000.0)
    return found


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_anatomy", description=__doc__)
    parser.add_argument("--rates", default="25,100")
    parser.add_argument("--duration-s", type=float, default=15.0)
    args = parser.parse_args(argv)
    document: dict[str, object] = {}
    with running_stack(2) as stack:
        processes = stack.processes
        warm_up(processes.url)
        for rate in (float(r) for r in args.rates.split(",")):
            plan = short_completions(rate, int(rate * args.duration_s), seed=7)
            result = asyncio.run(
                replay(plan, processes.url, timeout_s=60, progress=False, run_id=f"a{rate:g}")
            )
            inbox = asyncio.run(
                read_topic(processes.kafka_bootstrap, processes.topic_prefix, WORKER_INBOX)
            )
            answers = asyncio.run(
                read_topic(processes.kafka_bootstrap, processes.topic_prefix, ANSWERS)
            )
            sent_s = {
                r.message.request.request_id: r.timestamp_ms / 1000.0
                for r in inbox
                if isinstance(r.message, Assignment) and r.message.epoch == 0
            }
            answered_s = {
                r.message.request_id: r.timestamp_ms / 1000.0
                for r in answers
                if isinstance(r.message, Completion)
            }
            found = segments_ms(result.records, sent_s, answered_s)
            counted = len(found["ingress"])
            row = {
                name: {"p50_ms": statistics.median(v), "p90_ms": _p90(v)}
                for name, v in found.items()
                if v
            }
            document[f"{rate:g}"] = {"requests": counted, "segments": row}
            cells = "; ".join(
                f"{name} {v['p50_ms']:.2f} (P90 {v['p90_ms']:.2f})" for name, v in row.items()
            )
            print(f"{rate:g}/s, {counted} requests, ms: {cells}", flush=True)
    out = RESULTS / "latency_anatomy.json"
    out.write_text(json.dumps(document, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
