"""A small real service for runtime tests: it works through numbered items.

Each item takes WORK_ITEM_S seconds; the service appends ``started N`` and ``finished N``
to WORK_LOG as it goes. On SIGTERM it finishes the item in hand and starts no other.
Run as ``python -m tests.support.work_service``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from switchyard.runtime import Service, main_for


class WorkService(Service):
    async def start(self) -> None:
        self.log_path = Path(os.environ["WORK_LOG"])
        self.item_s = float(os.environ.get("WORK_ITEM_S", "0.5"))
        self.spawn_routine("work_routine", self.work_routine)

    async def work_routine(self) -> None:
        item = 0
        while not self.ctx.stopping.is_set():
            item += 1
            self._note(f"started {item}")
            await asyncio.sleep(self.item_s)
            self._note(f"finished {item}")

    def _note(self, line: str) -> None:
        with self.log_path.open("a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main_for(WorkService, name="work")
