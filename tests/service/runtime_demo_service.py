"""A small real service for the runtime's signal tests: it works through numbered items.

Each item takes ``DEMO_ITEM_S`` seconds (default 0.5); the service appends ``started N``
and ``finished N`` to the file ``DEMO_WORK_LOG`` as it goes, and ``drain`` when its drain
begins. When ``DEMO_DRAIN_GATE`` names a file, the item in hand at a stop finishes only
once that file exists, so a test can look at the draining process without racing it.

Run as ``python -m tests.service.runtime_demo_service`` with ``SWITCHYARD_BUS=memory
SWITCHYARD_STATE=memory SWITCHYARD_HEALTH_PORT=0``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from switchyard.runtime import Service, main_for


class DemoService(Service):
    """One routine, ``work_routine``, doing one item at a time until stopping."""

    async def start(self) -> None:
        self.log_path = Path(os.environ["DEMO_WORK_LOG"])
        self.item_s = float(os.environ.get("DEMO_ITEM_S", "0.5"))
        gate = os.environ.get("DEMO_DRAIN_GATE")
        self.gate = Path(gate) if gate else None
        self.spawn_routine("work_routine", self.work_routine)

    async def drain(self) -> None:
        self._note("drain")
        await super().drain()

    async def work_routine(self) -> None:
        item = 0
        while not self.ctx.stopping.is_set():
            item += 1
            self._note(f"started {item}")
            await asyncio.sleep(self.item_s)
            if self.ctx.stopping.is_set() and self.gate is not None:
                # The gate is a file another process creates: there is nothing to await.
                while not self.gate.exists():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            self._note(f"finished {item}")

    def _note(self, line: str) -> None:
        with self.log_path.open("a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main_for(DemoService, name="demo")
