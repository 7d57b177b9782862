"""The analytical performance model of one LLM serving instance.

A :class:`PerformanceModel` says how long a continuous-batching engine (vLLM-like)
spends on each iteration of one model on one kind of GPU:

- a *prefill* iteration runs the prompts of the requests it admits and yields each
  one's first token: ``base + per_token * sum(p) + per_token_sq * sum(p * p)`` (the
  linear layers cost the same for every token; causal attention grows with the square
  of each prompt's length);
- a *decode* step yields one more token for every running request:
  ``base + per_seq * batch_size + per_kv_token * kv_tokens`` (reading the weights once
  per step, the per-sequence work, and reading every cached key and value once);
- a *mixed* iteration (chunked prefill, as Sarathi-Serve and vLLM's
  ``enable_chunked_prefill`` run it) prefills chunks of prompts and decodes the running
  batch in one pass: the two sums above with one fixed time
  (:meth:`PerformanceModel.mixed_iteration_s`).

It is a model, not a measurement: the coefficients come from datasheet peaks scaled by
efficiency factors taken from published measurements (see ``switchyard/perf/data``).
Its shape is what the simulator relies on: the decode step is linear in the batch size
and in the KV tokens, so ``k`` consecutive steps of an unchanged batch have a closed
form and so does its inverse, and the simulator never steps through them one by one.

Everything here is plain float arithmetic: the simulator calls these methods in its
innermost loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def _check_count(value: int, what: str) -> None:
    if value < 0:
        raise ValueError(f"{what} must be non-negative, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PerformanceModel:
    """Iteration times and memory limits of one model served on one kind of GPU.

    Attributes:
        name: the profile name, ``"GPU/MODEL"`` (e.g. ``"a100-80gb/llama-2-7b"``).
        gpu: the GPU profile's name.
        model: the model profile's name.
        tensor_parallel: GPUs one instance spans (tensor parallelism).
        max_batch_slots: the most requests one instance runs at once.
        max_batched_tokens: the prompt-token budget of one prefill iteration.
        kv_capacity_tokens: tokens the instance's KV cache holds.
        kv_bytes_per_token: KV-cache bytes of one token (all layers, keys and values).
        interconnect_bytes_per_s: bandwidth for moving KV cache to another instance.
        prefill_base_s: fixed time of a prefill iteration.
        prefill_per_token_s: prefill time per prompt token.
        prefill_per_token_sq_s: prefill time per squared prompt length (attention).
        decode_base_s: fixed time of a decode step (mostly reading the weights).
        decode_per_seq_s: decode-step time per running sequence.
        decode_per_kv_token_s: decode-step time per cached token read.
        sources: where the constants behind the coefficients come from.
    """

    name: str
    gpu: str
    model: str
    tensor_parallel: int
    max_batch_slots: int
    max_batched_tokens: int
    kv_capacity_tokens: int
    kv_bytes_per_token: int
    interconnect_bytes_per_s: float
    prefill_base_s: float
    prefill_per_token_s: float
    prefill_per_token_sq_s: float
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_kv_token_s: float
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems: list[str] = []
        for field in ("tensor_parallel", "max_batch_slots", "max_batched_tokens"):
            if getattr(self, field) < 1:
                problems.append(f"{field} must be at least 1")
        if self.kv_capacity_tokens < 0:
            problems.append("kv_capacity_tokens must be non-negative")
        if self.kv_bytes_per_token < 1:
            problems.append("kv_bytes_per_token must be at least 1")
        if not (math.isfinite(self.interconnect_bytes_per_s) and self.interconnect_bytes_per_s > 0):
            problems.append("interconnect_bytes_per_s must be a positive number")
        for field in (
            "prefill_base_s",
            "prefill_per_token_s",
            "prefill_per_token_sq_s",
            "decode_base_s",
            "decode_per_seq_s",
            "decode_per_kv_token_s",
        ):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"{field} must be a non-negative number, got {value!r}")
        # A step that takes no time would let steps_within count forever.
        if self.decode_base_s + self.decode_per_seq_s <= 0:
            problems.append("a decode step must take time: decode_base_s + decode_per_seq_s > 0")
        if problems:
            raise ValueError(f"performance model {self.name!r}: " + "; ".join(problems))

    # -- prefill ---------------------------------------------------------------------

    def prefill_s(self, prompt_tokens: Sequence[int]) -> float:
        """Seconds of one prefill iteration over these prompts (0 when there are none).

        The iteration ends with the first output token of every prompt.
        """
        total = 0
        squares = 0
        for tokens in prompt_tokens:
            if tokens < 0:
                raise ValueError(f"prompt_tokens must be non-negative, got {tokens}")
            total += tokens
            squares += tokens * tokens
        if not prompt_tokens:
            return 0.0
        return (
            self.prefill_base_s
            + self.prefill_per_token_s * total
            + self.prefill_per_token_sq_s * squares
        )

    # -- decode ----------------------------------------------------------------------

    def decode_step_s(self, batch_size: int, kv_tokens: int) -> float:
        """Seconds of one decode step of ``batch_size`` sequences holding ``kv_tokens``.

        ``kv_tokens`` counts every cached token the step reads, over the whole batch
        (including each sequence's newest token). An empty batch takes no time.
        """
        if batch_size <= 0 or kv_tokens < 0:
            # One comparison on the simulator's path; the checks name what is wrong.
            _check_count(batch_size, "batch_size")
            _check_count(kv_tokens, "kv_tokens")
            return 0.0
        return (
            self.decode_base_s
            + self.decode_per_seq_s * batch_size
            + self.decode_per_kv_token_s * kv_tokens
        )

    def decode_steps_s(self, batch_size: int, kv_tokens: int, steps: int) -> float:
        """Seconds of ``steps`` consecutive decode steps of an unchanged batch.

        The first step reads ``kv_tokens`` cached tokens and every step adds one token
        per sequence, so step ``i`` (from 0) costs ``decode_step_s(batch_size,
        kv_tokens + i * batch_size)``; this is their sum in closed form.
        """
        if batch_size <= 0 or steps <= 0 or kv_tokens < 0:
            _check_count(batch_size, "batch_size")
            _check_count(kv_tokens, "kv_tokens")
            _check_count(steps, "steps")
            return 0.0
        per_kv_s = self.decode_per_kv_token_s
        first_s = self.decode_base_s + self.decode_per_seq_s * batch_size + per_kv_s * kv_tokens
        # sum_{i<k} (first + i * growth) = k * first + growth * k (k - 1) / 2, growth being
        # per_kv_s * batch_size; the integer product stays exact however many steps.
        return steps * first_s + per_kv_s * batch_size * (steps * (steps - 1) // 2)

    def steps_within(self, batch_size: int, kv_tokens: int, budget_s: float) -> int:
        """The most consecutive decode steps that finish within ``budget_s`` seconds.

        Exact: ``decode_steps_s(batch_size, kv_tokens, k) <= budget_s`` for the ``k``
        returned and not for ``k + 1``. A negative budget fits no step. The batch must
        not be empty (steps of an empty batch take no time, so any count would fit).
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if kv_tokens < 0:
            _check_count(kv_tokens, "kv_tokens")
        if not math.isfinite(budget_s):
            raise ValueError(f"budget_s must be a finite number of seconds, got {budget_s!r}")
        per_kv_s = self.decode_per_kv_token_s
        first_s = self.decode_base_s + self.decode_per_seq_s * batch_size + per_kv_s * kv_tokens
        if budget_s < first_s:
            return 0
        growth_s = per_kv_s * batch_size
        # total(k) = (growth/2) k^2 + (first - growth/2) k; the positive root of
        # total(k) = budget, written as 2B / (h + sqrt(h^2 + 2gB)) so that it neither
        # cancels nor divides by zero when growth is 0.
        half = first_s - 0.5 * growth_s
        steps = int(2.0 * budget_s / (half + math.sqrt(half * half + 2.0 * growth_s * budget_s)))
        # The root is exact up to rounding; settle the last step with the same
        # arithmetic decode_steps_s uses, so the two always agree.
        while (steps + 1) * first_s + growth_s * ((steps + 1) * steps // 2) <= budget_s:
            steps += 1
        while steps > 0 and steps * first_s + growth_s * (steps * (steps - 1) // 2) > budget_s:
            steps -= 1
        return steps

    # -- mixed iterations (chunked prefill) ---------------------------------------------

    def mixed_iteration_s(
        self, chunks: Sequence[tuple[int, int]], batch_size: int, kv_tokens: int
    ) -> float:
        """Seconds of one chunked-prefill iteration: prefill chunks and a decode batch.

        ``chunks`` holds, per prefilling request, ``(context, tokens)``: the prompt
        tokens whose KV cache it already has (earlier chunks, a cached prefix) and the
        tokens it prefills now. ``batch_size`` sequences decode one token each, reading
        ``kv_tokens`` cached tokens in all (as :meth:`decode_step_s`). The time is

            base + per_token * sum(c) + per_token_sq * sum((k + c)^2 - k^2)
                 + per_seq * batch_size + per_kv_token * kv_tokens

        with ``base`` the larger of the prefill and decode fixed times (the weights are
        read once per iteration). A chunk's attention term is what its tokens add to
        the square of the prompt's length, so the chunks of one prompt sum to exactly
        the ``per_token_sq * p * p`` of :meth:`prefill_s`: chunking adds a fixed time
        per iteration and nothing else. With no chunks this is :meth:`decode_step_s`;
        with no decode batch and no context it is :meth:`prefill_s` (to the bit when
        the two fixed times are equal, as every bundled profile has them).

        This is a model, not a measurement: the prefill and decode terms are added as
        they are measured apart. A real engine overlaps some of the decode batch's
        memory-bound work with a compute-bound chunk (Sarathi-Serve's premise), so
        this errs on the slow side for a mixed batch.
        """
        if not chunks:
            return self.decode_step_s(batch_size, kv_tokens)
        total = 0
        attention = 0
        for context, tokens in chunks:
            if context < 0 or tokens < 0:
                _check_count(context, "chunk context")
                _check_count(tokens, "chunk tokens")
            total += tokens
            end = context + tokens
            attention += end * end - context * context
        base_s = self.prefill_base_s
        if self.decode_base_s > base_s:
            base_s = self.decode_base_s
        time_s = base_s + self.prefill_per_token_s * total + self.prefill_per_token_sq_s * attention
        if batch_size > 0:
            if kv_tokens < 0:
                _check_count(kv_tokens, "kv_tokens")
            time_s += self.decode_per_seq_s * batch_size + self.decode_per_kv_token_s * kv_tokens
        elif batch_size < 0:
            _check_count(batch_size, "batch_size")
        return time_s

    def chunk_budget_problem(self, tokens: int) -> str | None:
        """Why ``tokens`` cannot be this instance's chunked-prefill budget (None: it can).

        Every running request decodes one token of the budget per iteration, so it must
        cover every batch slot (vLLM asks the same of ``max_num_batched_tokens`` and
        ``max_num_seqs``).
        """
        if tokens < 1:
            return f"the chunked-prefill budget must be at least 1 token, got {tokens}"
        if tokens < self.max_batch_slots:
            return (
                f"the chunked-prefill budget ({tokens} tokens) must be at least the "
                f"{self.max_batch_slots} batch slots of {self.name}: every running request "
                "decodes one token of it per iteration (vLLM asks the same of "
                "max_num_batched_tokens and max_num_seqs)"
            )
        return None

    # -- whole requests ------------------------------------------------------------------

    def idle_service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds to serve one request alone on an idle instance.

        The prefill yields the first output token; each further token takes one decode
        step of a batch of one, whose KV cache starts at the prompt plus that token.
        """
        _check_count(prompt_tokens, "prompt_tokens")
        _check_count(output_tokens, "output_tokens")
        total_s = self.prefill_s((prompt_tokens,))
        if output_tokens > 1:
            total_s += self.decode_steps_s(1, prompt_tokens + 1, output_tokens - 1)
        return total_s

    # -- KV cache ------------------------------------------------------------------------

    def kv_bytes(self, tokens: int) -> int:
        """Bytes of KV cache that ``tokens`` tokens occupy on the instance."""
        _check_count(tokens, "tokens")
        return tokens * self.kv_bytes_per_token

    def kv_transfer_s(self, tokens: int) -> float:
        """Seconds to send the KV cache of ``tokens`` tokens to another instance.

        Bandwidth only: fixed costs of a migration (handshake, scheduling) are the
        caller's to add.
        """
        return self.kv_bytes(tokens) / self.interconnect_bytes_per_s
