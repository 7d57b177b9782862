"""A grid of simulations: policies x cluster sizes x load scales x predictor errors x seeds.

This is what ``switchyard simulate`` runs. Every run starts from the same trace rows
(scaled in load), its own cluster and its own seeded generators, so runs are
independent and the same configuration gives the same JSON (apart from ``sim_wall_s``,
the wall-clock time the run took).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from switchyard.contracts.fields import WorkloadType
from switchyard.policies.registry import LlmPolicy, PolicyOptions, make_llm_policy
from switchyard.prediction import CalibrationConfig
from switchyard.slo import DEFAULT_TOKEN_SLOS, TokenSlo

from research.llm.config import SimulationConfig
from research.llm.request import LlmTraceRequest
from research.llm.simulator import Simulator


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentConfig:
    trace: str
    policies: tuple[str, ...]
    workers: tuple[int, ...] = (8,)
    profiles: tuple[str, ...] = ("a100-80gb/llama-2-7b",)
    load_scales: tuple[float, ...] = (1.0,)
    predictor_errors: tuple[float, ...] = (0.0,)
    slo_scale: float = 5.0
    token_slos: dict[WorkloadType, TokenSlo] = field(
        default_factory=lambda: dict(DEFAULT_TOKEN_SLOS)
    )
    predictor: str = "linear"
    seeds: int = 1
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    policy_options: PolicyOptions = field(default_factory=PolicyOptions)
    chunked_prefill_tokens: int | None = None
    """Chunked prefill's token budget per iteration (None: off; see SimulationConfig)."""
    prefill_workers: int | None = None
    """Workers of each cluster that only prefill, the rest only decode (None: off;
    see SimulationConfig)."""
    decode_at_arrival: bool = False
    """With ``prefill_workers``: decode workers chosen on arrival (see SimulationConfig)."""
    heartbeat_s: float | None = None
    """Policies decide on heartbeats this often (None: on the instant's state; see
    SimulationConfig)."""

    def runs(self) -> int:
        return (
            len(self.policies)
            * len(self.workers)
            * len(self.load_scales)
            * len(self.predictor_errors)
            * self.seeds
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["policy_options"] = {
            "gaps": asdict(self.policy_options.gaps),
            "gaps_rebalance": asdict(self.policy_options.gaps_rebalance),
            "prefill_fraction": self.policy_options.prefill_fraction,
            "admission": self.policy_options.admission,
        }
        return data


TraceForScale = Callable[[float], Sequence[LlmTraceRequest]]
"""Returns the trace rows at a load scale (arrival gaps divided by the scale)."""


def run_experiment(
    config: ExperimentConfig,
    trace_at: TraceForScale,
    *,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    on_requests: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every run of the grid, in a stable order; ``on_run`` sees each as it ends.

    Raises:
        UnknownPolicyError, SimulationError: before the first run, for a bad name or
        setting, so a long grid never fails half-way on a typo.
    """
    policies = [make_llm_policy(name, config.policy_options) for name in config.policies]
    for workers in config.workers:
        SimulationConfig(
            workers=workers,
            profiles=config.profiles,
            slo_scale=config.slo_scale,
            chunked_prefill_tokens=config.chunked_prefill_tokens,
            prefill_workers=config.prefill_workers,
            decode_at_arrival=config.decode_at_arrival,
            heartbeat_s=config.heartbeat_s,
        )
    runs: list[dict[str, Any]] = []
    for load_scale in config.load_scales:
        rows = trace_at(load_scale)
        for workers in config.workers:
            for error in config.predictor_errors:
                for seed in range(config.seeds):
                    for policy in policies:
                        run = simulate_one(
                            config,
                            policy,
                            rows,
                            workers=workers,
                            load_scale=load_scale,
                            predictor_error=error,
                            seed=seed,
                            on_requests=on_requests,
                        )
                        runs.append(run)
                        if on_run is not None:
                            on_run(run)
    return runs


def simulate_one(
    config: ExperimentConfig,
    policy: LlmPolicy,
    rows: Sequence[LlmTraceRequest],
    *,
    workers: int,
    load_scale: float,
    predictor_error: float,
    seed: int,
    on_requests: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One run of the grid: ``rows`` (already at ``load_scale``) on a fresh cluster."""
    sim_config = SimulationConfig(
        workers=workers,
        profiles=config.profiles,
        slo_scale=config.slo_scale,
        token_slos=config.token_slos,
        predictor=config.predictor,
        predictor_error=predictor_error,
        calibration=config.calibration,
        seed=seed,
        chunked_prefill_tokens=config.chunked_prefill_tokens,
        prefill_workers=config.prefill_workers,
        decode_at_arrival=config.decode_at_arrival,
        heartbeat_s=config.heartbeat_s,
    )
    simulator = Simulator(policy, sim_config, on_progress=on_requests)
    started = time.perf_counter()
    metrics = simulator.run(rows)
    wall_s = time.perf_counter() - started
    return {
        "policy": policy.name,
        "reference": policy.reference,
        "workers": workers,
        "seed": seed,
        "trace": config.trace,
        "load_scale": load_scale,
        "predictor_error": predictor_error,
        "gpu": ",".join(config.profiles),
        "slo_scale": config.slo_scale,
        **metrics.to_json(),
        "sim_wall_s": wall_s,
        "simulated_rps": metrics.requests / wall_s if wall_s > 0 else 0.0,
    }
