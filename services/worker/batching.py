"""Which waiting requests start together: pure functions over queue order.

Two shapes of batching share this module:

- *static batches* (:func:`pick_batch`): the torch classifier and the tiny language
  model run one batch to completion. The head of the queue (the first ready request)
  always starts, so no request starves; later ready requests of the same model and
  variant join it, up to ``max_batch``. They may overtake requests of other models that
  are ahead of them in order: that is the point of batching (one model load, one
  forward pass), and the head still goes first.
- *continuous batching* (:func:`admit_continuous`): the emulated LLM admits waiting
  requests into a running batch between iterations, like vLLM without chunked prefill:
  strictly in queue order (the first that does not fit blocks the rest, as in
  :mod:`research.llm.instance`), within free slots, KV-cache memory reserved for
  prompt plus the whole output, and a prefill token budget (at least one request).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.worker.queue import WorkItem


def pick_batch(ready: Sequence[WorkItem], max_batch: int) -> list[WorkItem]:
    """The next static batch from ``ready`` (ready items, in queue order).

    Returns the head plus the following items with the head's :class:`BatchKey`, at most
    ``max_batch`` in all, in queue order; empty when nothing is ready.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    if not ready:
        return []
    key = ready[0].key
    batch = [item for item in ready if item.key == key]
    return batch[:max_batch]


def kv_reservation_tokens(item: WorkItem) -> int:
    """KV-cache tokens an LLM request reserves at admission: its prompt plus its whole output."""
    return item.prompt_tokens + item.output_tokens


def admit_continuous(
    ready: Sequence[WorkItem],
    *,
    free_slots: int,
    kv_free_tokens: int,
    prefill_token_budget: int,
) -> list[WorkItem]:
    """The ready requests one prefill iteration admits, in queue order.

    A request needs a free slot and ``prompt + output`` free KV tokens; its prefill covers
    ``prompt + generated`` tokens, none for a request that brings its KV cache
    (``WorkItem.brings_kv``). The prefill tokens of an iteration stay within ``prefill_token_budget``,
    except that the first request is always admitted when it fits the slots and memory.
    Admission stops at the first request that does not fit, keeping queue order.
    """
    admitted: list[WorkItem] = []
    prefill_tokens = 0
    for item in ready:
        if len(admitted) >= free_slots:
            break
        need = kv_reservation_tokens(item)
        if need > kv_free_tokens:
            break
        tokens = 0 if item.brings_kv else item.context_tokens
        if admitted and prefill_tokens + tokens > prefill_token_budget:
            break
        admitted.append(item)
        kv_free_tokens -= need
        prefill_tokens += tokens
    return admitted
