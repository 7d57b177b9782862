"""The monitor's read-back after a state store lost its data: CPU a record.

Publishes ``--records`` assignments (a 500-token prompt each) on the in-memory bus, then
times :func:`services.monitor.restore.restore_from_broker` into an empty in-memory
store: every assignment is decoded and recorded again as pending. Process CPU seconds
over records, medians of ``--runs``. No broker and no Redis: this is the monitor's own
Python, the floor under what a Kafka and Redis read-back costs.

Run ``python -m bench.restore_bench [--records 20000] [--runs 3]``. Figures in
docs/reliability.md, "Redis: what survives a restart".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence

from switchyard.bus import Bus, MemoryBroker, MemoryTransport
from switchyard.contracts.messages import Assignment, InferenceRequest, LLMPayload
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.lifecycle import RequestLedger
from switchyard.state import MemoryStateStore

from services.monitor.restore import restore_from_broker


async def _one_run(records: int) -> float:
    """CPU seconds the read-back of ``records`` assignments took."""
    bus = Bus(MemoryTransport(MemoryBroker()))
    ledger = RequestLedger(MemoryStateStore("restore-bench:"))
    now_s = time.time()
    for i in range(records):
        request = InferenceRequest(
            request_id=f"r{i}",
            app="chat",
            payload=LLMPayload(model="llama-2-7b", prompt_tokens=500, max_output_tokens=200),
            arrival_s=now_s,
            reply_to="ingress-a",
        )
        assignment = Assignment(
            request=request,
            worker_id="w1",
            variant="llama-2-7b",
            order=1.0,
            policy="jsq",
            epoch=0,
            assigned_at_s=now_s,
        )
        await bus.publish(WORKER_INBOX, assignment, partition=0)
    started = time.process_time()
    await restore_from_broker(bus, ledger, stopping=asyncio.Event())
    return time.process_time() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.records < 1 or args.runs < 1:
        parser.error("--records and --runs must be at least 1")
    cpu_s = [asyncio.run(_one_run(args.records)) for _ in range(args.runs)]
    median_s = statistics.median(cpu_s)
    print(
        f"{args.records} assignments read back: {median_s:.2f} s of CPU (median of "
        f"{args.runs}), {median_s / args.records * 1e6:.0f} us a record"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
