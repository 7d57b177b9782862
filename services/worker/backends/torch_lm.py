"""The tiny torch language model: a real decoder-only transformer with random weights.

It stands in for an LLM where real computation matters more than good text: every token
it returns comes from an actual forward pass (prefill over the prompt, then one decode
step per token with a KV cache), on CUDA when the worker may use it and one is present,
else on the CPU. The vocabulary is the 256 byte values plus two specials (``BOS``,
``PAD``), so text in and out needs no tokenizer; output bytes decode as UTF-8 with
``errors="replace"``. Weights are drawn from a fixed seed: the same prompt always gives the
same output (greedy decoding). Random weights have learnt no end of sequence, so a request
generates its whole ``max_output_tokens``, as an emulated one does. A request with
``choices`` answers the label whose bytes the model scores most likely after its prompt
(:func:`choose_label`), as a constrained choice does on a serving engine.

torch is imported at module level here: this module is imported only when a worker runs
the torch backend (``SWITCHYARD_WORKER_BACKEND=torch``).
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from switchyard.contracts.messages import Assignment, LLMPayload, LLMResult
from switchyard.serving import TINY_LM_MODEL
from torch import nn
from torch.nn import functional

from services.worker.backends.base import ExecutionSink, UnsupportedWorkError, WorkSpec
from services.worker.model_cache import ModelCache, ModelCacheError
from services.worker.queue import BatchKey, WorkItem

BYTE_TOKENS = 256
BOS = 256
PAD = 257
VOCAB_TOKENS = 258

_DEFAULT_STEP_S = 0.002
"""A decode step's duration before any was measured (for queue estimates only)."""


def resolve_device(setting: str) -> str:
    """The torch device a worker uses: ``cuda`` when asked for or (``auto``) present.

    Raises:
        UnsupportedWorkError: ``cuda`` was asked for and none is present.
    """
    if setting == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if setting == "cuda" and not available:
        raise UnsupportedWorkError(
            "SWITCHYARD_WORKER_DEVICE=cuda but torch sees no CUDA device; use auto or cpu"
        )
    return "cuda" if available else "cpu"


@dataclass(frozen=True, slots=True)
class TinyLmConfig:
    """Shape of the tiny model (about 0.6 M parameters by default)."""

    layers: int = 2
    d_model: int = 128
    heads: int = 4
    d_ff: int = 512
    context_tokens: int = 1024
    seed: int = 0


class _Block(nn.Module):
    def __init__(self, config: TinyLmConfig) -> None:
        super().__init__()
        d = config.d_model
        self.heads = config.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, config.d_ff)
        self.ff2 = nn.Linear(config.d_ff, d)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch, length, d = x.shape
        head_dim = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        attended = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, d))
        x = x + self.ff2(functional.gelu(self.ff1(self.ln2(x))))
        return x, (k, v)


class TinyLm(nn.Module):
    """A byte-level decoder-only transformer (pre-norm blocks, learnt positions)."""

    def __init__(self, config: TinyLmConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(VOCAB_TOKENS, config.d_model)
        self.positions = nn.Embedding(config.context_tokens, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, VOCAB_TOKENS, bias=False)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Logits ``[batch, length, vocab]`` and the extended KV cache.

        ``mask`` is boolean ``[batch, 1, length, past + length]``, True where a query may
        attend to a key.
        """
        x = self.tokens(tokens) + self.positions(positions)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        for index, block in enumerate(self.blocks):
            x, kv = block(x, mask, None if past is None else past[index])
            cache.append(kv)
        return self.head(self.ln_f(x)), cache

    def memory_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def build_tiny_lm(config: TinyLmConfig, device: str) -> TinyLm:
    """The model with weights drawn from ``config.seed`` (the same on every machine),
    on ``device``, in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = TinyLm(config)
    return model.to(device).eval()


def _left_padded(
    sequences: Sequence[Sequence[int]], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequences`` as one batch, left-padded with ``PAD``: the tokens and where they
    are valid, both ``[batch, longest]`` on ``device``."""
    longest = max(len(s) for s in sequences)
    tokens = torch.full((len(sequences), longest), PAD, dtype=torch.long)
    valid = torch.zeros((len(sequences), longest), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        tokens[row, longest - len(sequence) :] = torch.tensor(list(sequence), dtype=torch.long)
        valid[row, longest - len(sequence) :] = True
    return tokens.to(device), valid.to(device)


def _prefill_view(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions and causal attention mask of a left-padded batch's prefill."""
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    length = valid.shape[1]
    causal = torch.ones((length, length), dtype=torch.bool, device=valid.device).tril()
    mask = valid[:, None, None, :] & causal[None, None, :, :]
    # A padding query sees no valid key; let it see itself so softmax stays finite.
    mask = mask | torch.eye(length, dtype=torch.bool, device=valid.device)[None, None]
    return positions, mask


class Generation:
    """Greedy batched generation with a KV cache: :meth:`prefill` once, then :meth:`step`.

    Prompts are left-padded; every prompt starts with ``BOS``. Only byte tokens are ever
    chosen. Each call is a blocking forward pass: run it in a thread.
    """

    def __init__(self, model: TinyLm, prompts: Sequence[bytes]) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._tokens, self._valid = _left_padded([[BOS, *p] for p in prompts], self.device)
        self._past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._next_position = torch.zeros(len(prompts), dtype=torch.long, device=self.device)

    def prefill(self) -> list[int]:
        """Run the prompts; returns each one's first output byte."""
        with torch.inference_mode():
            positions, mask = _prefill_view(self._valid)
            logits, self._past = self.model(self._tokens, positions, mask)
            self._next_position = positions[:, -1] + 1
            return self._choose(logits[:, -1, :])

    def step(self, previous: Sequence[int]) -> list[int]:
        """One decode step fed with the last chosen bytes; returns the next byte of each."""
        if self._past is None:
            raise RuntimeError("step() before prefill()")
        with torch.inference_mode():
            tokens = torch.tensor(list(previous), dtype=torch.long, device=self.device)[:, None]
            ones = torch.ones((len(previous), 1), dtype=torch.bool, device=self.device)
            self._valid = torch.cat((self._valid, ones), dim=1)
            mask = self._valid[:, None, None, :]
            limit = self.model.config.context_tokens - 1
            positions = self._next_position.clamp(max=limit)[:, None]
            logits, self._past = self.model(tokens, positions, mask, self._past)
            self._next_position = self._next_position + 1
            return self._choose(logits[:, -1, :])

    @staticmethod
    def _choose(logits: torch.Tensor) -> list[int]:
        chosen: list[int] = logits[:, :BYTE_TOKENS].argmax(dim=-1).tolist()
        return chosen


def generate(model: TinyLm, prompts: Sequence[bytes], new_tokens: int) -> list[bytes]:
    """``new_tokens`` greedy output bytes for each prompt (blocking; for tests and tools)."""
    if new_tokens < 1:
        return [b"" for _ in prompts]
    generation = Generation(model, prompts)
    outputs = [[token] for token in generation.prefill()]
    for _ in range(new_tokens - 1):
        chosen = generation.step([out[-1] for out in outputs])
        for out, token in zip(outputs, chosen, strict=True):
            out.append(token)
    return [bytes(out) for out in outputs]


def choose_label(model: TinyLm, prompt: bytes, labels: Sequence[str]) -> str:
    """The label the model most likely generates after ``prompt``: the highest total
    log-probability of its UTF-8 bytes (one forward pass over every label, blocking).
    The prompt keeps its end when prompt and the longest label exceed the context."""
    encoded = [label.encode() for label in labels]
    room = model.config.context_tokens - 1 - max(len(e) for e in encoded)
    prompt = prompt[-room:] if room > 0 else b""
    device = next(model.parameters()).device
    tokens, valid = _left_padded([[BOS, *prompt, *label] for label in encoded], device)
    longest = tokens.shape[1]
    with torch.inference_mode():
        positions, mask = _prefill_view(valid)
        logits, _ = model(tokens, positions, mask)
        # Only byte tokens are ever generated: score within them, as generation chooses.
        log_probs = functional.log_softmax(logits[:, :, :BYTE_TOKENS].float(), dim=-1)
        scores = []
        for row, label in enumerate(encoded):
            # Label byte i sits at column longest - len(label) + i, predicted one before.
            columns = torch.arange(longest - len(label), longest, device=device)
            targets = tokens[row, columns]
            scores.append(float(log_probs[row, columns - 1, targets].sum()))
    return labels[max(range(len(labels)), key=scores.__getitem__)]


def synthetic_prompt(tokens: int) -> bytes:
    """A deterministic printable prompt of ``tokens`` bytes, for requests without text."""
    return bytes(32 + (index * 31 + 7) % 95 for index in range(tokens))


class TinyLmRunner:
    """Serves :data:`TINY_LM_MODEL` in static batches through the model cache.

    Attributes:
        device: ``cpu`` or ``cuda``.
        step_s: the last measured decode step (wall seconds).
    """

    def __init__(self, cache: ModelCache, device: str, config: TinyLmConfig | None = None) -> None:
        self.cache = cache
        self.device = device
        self.config = config or TinyLmConfig()
        self.step_s = _DEFAULT_STEP_S
        self.stepping = False
        self._size_bytes: int | None = None

    def servable_models(self) -> list[str]:
        return [TINY_LM_MODEL]

    def owns(self, key: BatchKey) -> bool:
        return key.model == TINY_LM_MODEL

    def prompt_bytes(self, item: WorkItem) -> bytes:
        """The prompt as bytes (UTF-8 of the text, or synthetic), trimmed to the context."""
        payload = item.request.payload
        if not isinstance(payload, LLMPayload):  # describe() let only LLM requests in
            raise UnsupportedWorkError("not an LLM request")
        raw = payload.prompt.encode() if payload.prompt else synthetic_prompt(payload.prompt_tokens)
        room = self.config.context_tokens - 1 - payload.max_output_tokens
        return raw[-room:] if len(raw) > room else raw

    def describe(self, assignment: Assignment) -> WorkSpec:
        payload = assignment.request.payload
        if not isinstance(payload, LLMPayload) or payload.model != TINY_LM_MODEL:
            raise UnsupportedWorkError(
                f"the tiny language model serves only model {TINY_LM_MODEL!r}"
            )
        room = self.config.context_tokens - 1
        if payload.max_output_tokens >= room:
            raise UnsupportedWorkError(
                f"{TINY_LM_MODEL} has a context of {self.config.context_tokens} tokens; "
                f"max_output_tokens={payload.max_output_tokens} leaves no room for a prompt"
            )
        prompt = len(payload.prompt.encode()) if payload.prompt else payload.prompt_tokens
        prompt = min(prompt, room - payload.max_output_tokens)
        return WorkSpec(
            key=BatchKey(TINY_LM_MODEL, assignment.variant),
            prompt_tokens=prompt,
            output_tokens=payload.max_output_tokens,
            estimate_s=self.step_s * (payload.max_output_tokens - assignment.generated_tokens + 1),
        )

    async def _result(self, model: TinyLm, item: WorkItem, output: bytearray) -> LLMResult:
        """The answer of a finished request: its text, or for a request with ``choices``
        the label the model scores most likely after the prompt."""
        payload = item.request.payload
        if isinstance(payload, LLMPayload) and payload.choices:
            labels = list(payload.choices)
            label = await asyncio.to_thread(choose_label, model, self.prompt_bytes(item), labels)
            return LLMResult(output_tokens=item.output_tokens, text=label, label=label)
        text = bytes(output).decode("utf-8", errors="replace")
        return LLMResult(output_tokens=item.output_tokens, text=text)

    def estimate_batch_s(self, items: Sequence[WorkItem]) -> float:
        """Wall seconds a batch of ``items`` takes: a prefill and one step per token of its
        longest request, at the last measured step time."""
        if not items:
            return 0.0
        longest = max(item.output_tokens - item.generated_tokens for item in items)
        return self.step_s * (longest + 1)

    def decode_step_s(self) -> float:
        return self.step_s if self.stepping else 0.0

    def _load(self) -> tuple[TinyLm, int]:
        model = build_tiny_lm(self.config, self.device)
        return model, model.memory_bytes()

    async def run(self, batch: list[WorkItem], sink: ExecutionSink) -> None:
        """Generate every request of ``batch`` together; each finishes when its own count
        of tokens is reached."""
        await sink.started(batch)
        for item in batch:
            item.ran_on = self.device
        try:
            async with self.cache.use(TINY_LM_MODEL, self._load) as model:
                await self._generate(model, batch, sink)
        except ModelCacheError as exc:
            for item in batch:
                await sink.failed(item, str(exc))

    async def _generate(self, model: TinyLm, batch: list[WorkItem], sink: ExecutionSink) -> None:
        generation = Generation(model, [self.prompt_bytes(item) for item in batch])
        decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in batch]
        outputs: list[bytearray] = [bytearray() for _ in batch]
        open_rows = set(range(len(batch)))
        chosen = await asyncio.to_thread(generation.prefill)
        self.stepping = True
        try:
            while True:
                for row in sorted(open_rows):
                    item = batch[row]
                    token = chosen[row]
                    outputs[row].append(token)
                    item.generated_tokens += 1
                    await sink.tokens(item, 1, decoders[row].decode(bytes([token])))
                    if item.generated_tokens >= item.output_tokens:
                        open_rows.discard(row)
                        tail = decoders[row].decode(b"", final=True)
                        if tail:
                            await sink.tokens(item, 0, tail)
                        await sink.finished(item, await self._result(model, item, outputs[row]))
                if not open_rows:
                    return
                started_s = time.perf_counter()
                chosen = await asyncio.to_thread(generation.step, chosen)
                self.step_s = time.perf_counter() - started_s
        finally:
            self.stepping = False
