"""Signals when services are embedded: a program that runs services with ``stop`` (the
embedded stack) keeps its own SIGTERM handler, however many of them have stopped."""

from __future__ import annotations

import asyncio
import os
import signal

from switchyard.errors import SwitchyardError
from switchyard.runtime import Service, run_service

from tests.service.runtime_support import (
    Harness,
    harness_fixture,  # noqa: F401 (the ``harness`` fixture)
    settings_for,
)


async def test_an_embedded_service_that_stops_leaves_the_programs_signal_handler(
    harness: Harness,
) -> None:
    """A program running services with ``stop`` (the embedded stack) keeps its SIGTERM
    handler when one of them stops: the next SIGTERM drains the rest instead of killing
    the process."""

    class Broken(Service):
        async def start(self) -> None:
            raise SwitchyardError("no such model registry")

    loop = asyncio.get_running_loop()
    program_stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, program_stop.set)
    try:
        code = await run_service(
            Broken,
            name="broken",
            settings=settings_for(),
            build_context=harness.build_context,
            stop=asyncio.Event(),
        )
        assert code == 1
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(program_stop.wait(), 5)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
