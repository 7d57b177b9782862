"""Small torch training helpers shared by the models Switchyard trains itself.

torch is imported inside each function, never at module import: a service that never
trains a model never loads it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["Adam", "one_thread"]


class Adam:
    """Adam (Kingma and Ba, 2015) with torch's default betas, written out.

    ``torch.optim`` loads torch's compiler stack on first use: seconds of start-up, more
    than a whole fit of the small networks trained here. These dozen tensor operations
    do the same update.
    """

    def __init__(self, parameters: list[torch.nn.Parameter], learning_rate: float) -> None:
        import torch

        self.parameters = parameters
        self.learning_rate = learning_rate
        self.first = [torch.zeros_like(p) for p in parameters]
        self.second = [torch.zeros_like(p) for p in parameters]
        self.steps = 0

    def step(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` and move every parameter one Adam step."""
        import torch

        for parameter in self.parameters:
            parameter.grad = None
        loss.backward()  # type: ignore[no-untyped-call]
        self.steps += 1
        beta1, beta2 = 0.9, 0.999
        correction1 = 1.0 - beta1**self.steps
        correction2_sqrt = math.sqrt(1.0 - beta2**self.steps)
        with torch.no_grad():
            for parameter, first, second in zip(
                self.parameters, self.first, self.second, strict=True
            ):
                grad = parameter.grad
                if grad is None:
                    continue
                first.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                second.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denominator = (second.sqrt() / correction2_sqrt).add_(1e-8)
                parameter.addcdiv_(first, denominator, value=-self.learning_rate / correction1)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread (deterministic, one core), then restore it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
