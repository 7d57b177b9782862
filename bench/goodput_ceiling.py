"""How far a trace's goodput target is from what its cluster can do at all, whatever
the scheduler.

Two measures, on the Azure traces of a capacity run (``make bench-capacity`` writes
``bench/results/capacity_eval.json``; A100 clusters, no chunked prefill or
disaggregation):

- **The compute ceiling**: every request's prefill and decode compute on the profile
  (:class:`~switchyard.perf.PerformanceModel`'s per-token, per-sequence and per-KV-token
  terms, without the fixed time of an iteration, which batching shares out) must run on
  some worker, so no policy sustains more than ``workers / mean compute per request``
  requests a second, at any latency. With 10 % of the requests refused (a 90 % target
  can afford it), at most ``workers / (0.9 x mean compute of the cheapest 90 %)``. The
  Mooncake trace is left out: its prefix hits make a request's compute depend on where it
  runs.
- **A clairvoyant admission** (``--admission-loads``; this bench's own, not a registered
  policy): Switchyard refusing a request when, on every worker, its latency estimated
  from the worker's batch with the request added (its *true* output length, the wait for
  the prompts queued ahead, its prefill) exceeds ``margin`` times its objective. It
  knows what no live admission can, so its goodput is above what a real one reaches on
  this model; run at multiples of the best baseline's capacity on the conversation trace
  at 16 workers (the target's 1.25 among them), with Switchyard alone beside it.

Run ``python -m bench.goodput_ceiling [--capacity-json PATH] [--margins 0.5,0.6,0.7]
[--admission-loads 1,1.1,1.25]``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from switchyard.perf import PerformanceModel, performance_model
from switchyard.policies.base import AdmissionPolicy, Refusal
from switchyard.policies.registry import LlmPolicy, make_llm_policy
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView
from switchyard.slo import token_slos
from switchyard.traces import TraceRequest, head, resolve_trace, scale_load

from bench.ttft_at_capacity import CAPACITY_JSON, best_baselines
from research.args import comma_list
from research.llm.config import SimulationConfig
from research.llm.simulator import Simulator

CEILING_TRACES = ("azure-conv", "azure-code")
TARGET_RATIO = 1.25
"""Issue 17's goodput target against the best baseline at 16 workers."""


def compute_s(perf: PerformanceModel, prompt_tokens: int, output_tokens: int) -> float:
    """A request's prefill and decode compute, without any iteration's fixed time."""
    prefill_s = (
        perf.prefill_per_token_s * prompt_tokens
        + perf.prefill_per_token_sq_s * prompt_tokens * prompt_tokens
    )
    # Each decode step reads the context so far: prompt + 1 .. prompt + output - 1.
    steps = max(0, output_tokens - 1)
    kv_read = steps * prompt_tokens + steps * (steps + 1) // 2
    decode_s = perf.decode_per_seq_s * steps + perf.decode_per_kv_token_s * kv_read
    return prefill_s + decode_s


def ceilings_rps(
    perf: PerformanceModel, rows: Sequence[TraceRequest], workers: int
) -> tuple[float, float]:
    """(every request served, the cheapest 90 % served), requests a second."""
    works = sorted(compute_s(perf, r.prompt_tokens, r.output_tokens) for r in rows)
    cheapest = works[: int(0.9 * len(works))]
    return workers / (sum(works) / len(works)), workers / (0.9 * sum(cheapest) / len(cheapest))


@dataclass(frozen=True, slots=True)
class ClairvoyantAdmission:
    """Refuse a request whose latency, estimated on its best worker with its true output
    length, exceeds ``margin`` times its objective; then the policy's own admission."""

    truths: Mapping[str, tuple[int, float]]
    """Request id -> (output tokens, latency objective in seconds)."""
    margin: float
    inner: AdmissionPolicy | None
    name: str = "clairvoyant"

    def admit(self, request: RequestView, cluster: ClusterSnapshot) -> Refusal | None:
        if self.inner is not None and (refusal := self.inner.admit(request, cluster)):
            return refusal
        output_tokens, objective_s = self.truths[request.request_id]
        best_s = min(self._latency_s(w, request, output_tokens) for w in cluster.eligible())
        if best_s > self.margin * objective_s:
            return Refusal(f"estimated {best_s:.1f} s > {self.margin:g} x {objective_s:.1f} s")
        return None

    def _latency_s(self, worker: WorkerView, request: RequestView, output_tokens: int) -> float:
        """The prompts queued ahead, its own prefill, then its decode steps in the batch
        with every request there and itself, the KV of its prompt and half its output. The
        profiles' fixed time of an iteration is the same for a prefill and a decode step,
        so ``prefill_base_s`` stands for the decode's (as in ``policies/cache_aware.py``)."""
        wait_s = worker.waiting_prompt_tokens * worker.prefill_per_token_s
        cached = request.cached_tokens.get(worker.worker_id, 0)
        prefill_s = worker.prefill_compute_s(request.prompt_tokens, cached)
        batch = worker.running + worker.waiting + 1
        kv_tokens = worker.queued_tokens + request.prompt_tokens + output_tokens // 2
        step_s = (
            worker.prefill_base_s
            + batch * worker.decode_step_per_seq_s
            + kv_tokens * worker.decode_step_per_kv_token_s
        )
        return wait_s + prefill_s + output_tokens * step_s


def _run(policy: LlmPolicy, rows: Sequence[TraceRequest], workers: int, profile: str) -> Any:
    config = SimulationConfig(workers=workers, profiles=(profile,), token_slos=token_slos())
    return Simulator(policy, config).run(rows)


def print_admission_rows(
    search: dict[str, Any], requests: int, loads: Sequence[float], margins: Sequence[float]
) -> None:
    """Print markdown rows: Switchyard plain and with the clairvoyant admission, per load."""
    trace = head(resolve_trace("azure-conv"), requests)
    profile = search["gpu"]
    perf = performance_model(profile)
    slo_scale = SimulationConfig(workers=search["workers"]).slo_scale
    held = search["targets"][0]["held"]
    for multiple in loads:
        scale = held["load_scale"] * multiple
        rows = scale_load(trace, scale).requests
        truths = {
            f"r{i}": (
                r.output_tokens,
                slo_scale * perf.idle_service_s(r.prompt_tokens, r.output_tokens),
            )
            for i, r in enumerate(rows)
        }
        plain = make_llm_policy("switchyard")
        settings: list[tuple[str, LlmPolicy]] = [("switchyard", plain)]
        for margin in margins:
            admission = ClairvoyantAdmission(truths, margin, plain.admission)
            settings.append(
                (f"+ clairvoyant, margin {margin:g}", replace(plain, admission=admission))
            )
        for label, policy in settings:
            m = _run(policy, rows, search["workers"], profile)
            print(
                f"| {multiple:g} ({held['offered_rps'] * multiple:.1f}) | {label} | "
                f"{m.refused / m.requests:.1%} | {m.slo_attainment:.1%} | {m.goodput_rps:.1f} |",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity-json", type=Path, default=CAPACITY_JSON)
    parser.add_argument(
        "--margins", type=comma_list(float, "--margins"), default=(0.5, 0.6, 0.7),
        help="the clairvoyant admission's margins (default 0.5,0.6,0.7)",
    )  # fmt: skip
    parser.add_argument(
        "--admission-loads", type=comma_list(float, "--admission-loads"),
        default=(1.0, 1.1, TARGET_RATIO),
        help="multiples of the best baseline's capacity (default 1,1.1,1.25; empty: skip)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.capacity_json.exists():
        raise SystemExit(f"{args.capacity_json}: not found; run `make bench-capacity` first")
    document = json.loads(args.capacity_json.read_text())
    requests = document["requests"]
    searches = [
        s
        for s in best_baselines(document)
        if s["trace"].split("[")[0] in CEILING_TRACES and "," not in s["gpu"]
    ]
    print(
        "| trace, cluster | best baseline's capacity, req/s | x 1.25 | compute ceiling | "
        "ceiling, 10 % refused | best baseline / ceiling | x 1.25 / ceiling |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for search in searches:
        trace_name = search["trace"].split("[")[0]
        rows = head(resolve_trace(trace_name), requests).requests
        ceiling, refused = ceilings_rps(performance_model(search["gpu"]), rows, search["workers"])
        held = search["targets"][0]["held"]["offered_rps"]
        print(
            f"| {trace_name}, {search['workers']} workers | {held:.3g} ({search['policy']}) | "
            f"{held * TARGET_RATIO:.3g} | {ceiling:.3g} | {refused:.3g} | "
            f"{held / ceiling:.0%} | {held * TARGET_RATIO / ceiling:.0%} |",
            flush=True,
        )
    conv16 = [s for s in searches if s["trace"].startswith("azure-conv") and s["workers"] == 16]
    if args.admission_loads and conv16:
        print("\nazure-conv, 16 workers: Switchyard with and without the clairvoyant admission")
        print(
            "| x best baseline's capacity (req/s) | setting | refused | SLO attainment | "
            "goodput req/s |"
        )
        print("|---|---|---:|---:|---:|")
        print_admission_rows(conv16[0], requests, args.admission_loads, args.margins)


if __name__ == "__main__":
    main()
