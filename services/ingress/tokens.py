"""How the ingress counts prompt tokens when the client does not say.

The ingress has no tokenizer (it must start fast and stay small), so it approximates:
``ceil(UTF-8 bytes / 4)``, at least 1. Four bytes a token is the usual rule of thumb for
English text under BPE tokenizers; it over-counts for code and under-counts for scripts
with multi-byte characters less than a character count would. A client that knows the
exact count (trace replay) sends ``switchyard.prompt_tokens`` instead, which wins.

Chat messages become one prompt with :func:`chat_prompt`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

BYTES_PER_TOKEN = 4


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
