"""How the ingress counts prompt tokens when the client does not say.

The ingress has no tokenizer (it must start fast and stay small), so it approximates:
``ceil(UTF-8 bytes / 4)``, at least 1. Four bytes a token is the usual rule of thumb for
English text under BPE tokenizers; it over-counts for code and under-counts for scripts
with multi-byte characters less than a character count would. A client that knows the
exact count (trace replay) sends ``switchyard.prompt_tokens`` instead, which wins.

Chat messages become one prompt with :func:`chat_prompt`. :func:`prompt_blocks` names
the prompt's KV blocks by content, for prefix caching.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS

BYTES_PER_TOKEN = 4
BLOCK_BYTES = PREFIX_BLOCK_TOKENS * BYTES_PER_TOKEN
"""Bytes of prompt text a KV block of :data:`PREFIX_BLOCK_TOKENS` tokens stands for."""


def approximate_tokens(text: str) -> int:
    """``ceil(len(text.encode("utf-8")) / 4)``, and at least 1 (an empty prompt still
    costs the model a step)."""
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def chat_prompt(messages: Iterable[tuple[str, str]]) -> str:
    """The prompt a chat conversation stands for: one ``"{role}: {content}"`` line per
    message, in order, joined with ``"\\n"``, then a final ``"\\nassistant:"`` that cues the
    answer (what chat templates do, in plain text).

    Example: ``[("system", "Be brief."), ("user", "Hi")]`` gives
    ``"system: Be brief.\\nuser: Hi\\nassistant:"``.
    """
    lines = [f"{role}: {content}" for role, content in messages]
    lines.append("assistant:")
    return "\n".join(lines)


def prompt_blocks(text: str) -> list[int]:
    """Content ids of the prompt's full KV blocks (:data:`BLOCK_BYTES` bytes of UTF-8
    text each; a partial last block is not named, as vLLM caches full blocks only).

    Each id hashes its block together with the id before it, so an id stands for the
    whole prefix up to its block's end and two prompts share a leading run of ids exactly
    when they share that much leading text. Example: a 5,000-byte prompt has two ids.
    """
    data = text.encode("utf-8")
    ids: list[int] = []
    previous = b""
    for start in range(0, len(data) - BLOCK_BYTES + 1, BLOCK_BYTES):
        digest = hashlib.blake2b(previous + data[start : start + BLOCK_BYTES], digest_size=8)
        previous = digest.digest()
        ids.append(int.from_bytes(previous, "big") >> 1)  # 63 bits: a non-negative int64
    return ids
