"""A serving instance's prefix cache: KV blocks kept by content, so that a prompt whose
leading blocks another request already computed skips their prefill.

This is the automatic prefix caching of vLLM and SGLang in the units traces give:
blocks of :data:`~switchyard.contracts.fields.PREFIX_BLOCK_TOKENS` tokens named by content ids
(the Mooncake format's ``hash_ids``, where an id stands for its block *and* everything
before it, so only a leading run of a prompt's ids can match). The simulator's instance
and the emulated worker hold one each; the shells show a placement policy how many of
a request's tokens each worker holds, as the KV events of vLLM let Dynamo's router and
llm-d's precise prefix scorer see.

Simplifications, against a real engine: the cache's capacity is the instance's whole
KV cache in blocks, and a block in use by a running request counts like any other
(it is shared, and it is the most recently used, so the least recently used blocks
are what a full cache gives up, as in vLLM); a hit skips the prefill of the matched
tokens entirely, while a real engine still reads their KV in the attention of the new
tokens; and a request's KV reservation still covers its whole prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS

__all__ = ["PrefixCache", "cached_tokens"]


def cached_tokens(matched_blocks: int, context_tokens: int) -> int:
    """Tokens of a ``context_tokens`` prefill that ``matched_blocks`` cached blocks
    spare: their tokens, but never the last token, whose computation gives the first
    output token."""
    return max(0, min(matched_blocks * PREFIX_BLOCK_TOKENS, context_tokens - 1))


class PrefixCache:
    """KV blocks by content id, the least recently used given up first.

    Args:
        capacity_blocks: how many blocks it holds (>= 0; 0 caches nothing).
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.lookups = 0
        self.hit_blocks = 0
        self.looked_up_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def matched_blocks(self, blocks: Sequence[int]) -> int:
        """How many leading ``blocks`` it holds; it is not changed (a placement policy's
        look, which must not count as a use)."""
        matched = 0
        held = self._blocks
        for block in blocks:
            if block not in held:
                break
            matched += 1
        return matched

    def use(self, blocks: Sequence[int]) -> int:
        """A prefill of ``blocks``: returns how many leading ones it held, then holds
        them all as the most recently used, giving up the least recently used beyond
        the capacity."""
        matched = self.matched_blocks(blocks)
        self.lookups += 1
        self.hit_blocks += matched
        self.looked_up_blocks += len(blocks)
        if self.capacity_blocks == 0:
            return matched
        held = self._blocks
        # Last block first, so that a prompt's leading blocks are the most recent: of
        # blocks used together the tail goes first, as vLLM's evictor does, since a
        # leading block lost makes every block after it unreachable.
        for block in reversed(blocks):
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)
        return matched

    @property
    def hit_rate(self) -> float:
        """Blocks found over blocks looked up, by :meth:`use` (0 before any)."""
        return self.hit_blocks / self.looked_up_blocks if self.looked_up_blocks else 0.0
