"""The latency objectives LLM serving is provisioned by, defined once for the simulator,
the load generator and the application registry.

A streamed answer is felt in two parts: the wait for its first token (**TTFT**, arrival
to first token) and the pace of the rest (**TPOT**, time per output token after the
first: ``(finished_s - first_token_s) / (output_tokens - 1)``; undefined for a one-token
answer, which then meets any TPOT objective). A request meets its SLO when it meets
every objective it has: TTFT, TPOT, and the end-to-end latency objective where one is
set. **Goodput** is the rate of requests that meet their SLO; a request that was
refused, failed or never answered counts as a miss.

Defaults per workload class (:data:`DEFAULT_TOKEN_SLOS`), for an application that sets
none: a code completion waits at most 0.5 s for its first token, a conversation or
any other request 1 s; every class streams at least ten tokens a second after that
(TPOT 0.1 s, faster than people read). For scale, on the bundled A100 llama-2-7b
profile an idle worker prefills a 2,000-token prompt in 0.16 s and a decode step at a
batch of 64 takes 0.046 s, so the defaults leave room for queueing and batching but
not for a backlog; on an L40S the same batch takes 0.097 s, at the edge of the TPOT
objective. ``switchyard simulate`` takes ``--ttft-slo-s`` and ``--tpot-slo-s`` for
other objectives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from switchyard.contracts.fields import WorkloadType

__all__ = [
    "DEFAULT_TOKEN_SLOS",
    "SloOutcome",
    "TokenSlo",
    "judge",
    "time_per_output_token_s",
    "token_slos",
]


@dataclass(frozen=True, slots=True)
class TokenSlo:
    """The token-level objectives of one application or workload class."""

    ttft_s: float
    """Arrival to first token, at most."""
    tpot_s: float
    """Time per output token after the first, at most."""

    def __post_init__(self) -> None:
        if not self.ttft_s > 0:
            raise ValueError(f"the TTFT objective must be > 0 s, got {self.ttft_s!r}")
        if not self.tpot_s > 0:
            raise ValueError(f"the TPOT objective must be > 0 s, got {self.tpot_s!r}")


DEFAULT_TOKEN_SLOS: Mapping[WorkloadType, TokenSlo] = MappingProxyType(
    {
        WorkloadType.CODE: TokenSlo(ttft_s=0.5, tpot_s=0.1),
        WorkloadType.CONVERSATION: TokenSlo(ttft_s=1.0, tpot_s=0.1),
        WorkloadType.OTHER: TokenSlo(ttft_s=1.0, tpot_s=0.1),
    }
)
"""The objectives of a workload class whose application sets none (module docstring)."""


def token_slos(
    *, ttft_s: float | None = None, tpot_s: float | None = None
) -> dict[WorkloadType, TokenSlo]:
    """:data:`DEFAULT_TOKEN_SLOS`, with ``ttft_s`` and ``tpot_s`` (when given) in place of
    every class's own."""
    return {
        workload: TokenSlo(
            ttft_s=slo.ttft_s if ttft_s is None else ttft_s,
            tpot_s=slo.tpot_s if tpot_s is None else tpot_s,
        )
        for workload, slo in DEFAULT_TOKEN_SLOS.items()
    }


def time_per_output_token_s(
    first_token_s: float, finished_s: float, output_tokens: int
) -> float | None:
    """TPOT of one answer; None for an answer of fewer than two tokens."""
    if output_tokens < 2:
        return None
    return (finished_s - first_token_s) / (output_tokens - 1)


@dataclass(frozen=True, slots=True)
class SloOutcome:
    """Which objectives one answered request met."""

    ttft_met: bool
    tpot_met: bool
    latency_met: bool

    @property
    def met(self) -> bool:
        return self.ttft_met and self.tpot_met and self.latency_met


def judge(
    slo: TokenSlo,
    *,
    ttft_s: float,
    tpot_s: float | None,
    latency_s: float,
    latency_slo_s: float | None = None,
) -> SloOutcome:
    """Judge one answered request against ``slo`` (and ``latency_slo_s``, end to end,
    when given). A TPOT of None (a one-token answer) meets the TPOT objective."""
    return SloOutcome(
        ttft_met=ttft_s <= slo.ttft_s,
        tpot_met=tpot_s is None or tpot_s <= slo.tpot_s,
        latency_met=latency_slo_s is None or latency_s <= latency_slo_s,
    )
