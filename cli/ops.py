"""The operator's commands over the configured bus and store: ``config``, ``check``,
``topics`` and ``dead-letters``."""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from switchyard.config import Settings
from switchyard.errors import SwitchyardError
from switchyard.runtime import loop as event_loop
from switchyard.runtime.connections import redact_url

from cli.exit_codes import EXIT_UNAVAILABLE


def cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    shown = settings.model_dump(mode="json")
    if "redis_url" in shown:
        shown["redis_url"] = redact_url(settings.redis_url)
    print(json.dumps(shown, indent=2, sort_keys=True))
    return 0


async def _check(settings: Settings) -> int:
    from switchyard.bus import bus_from_settings
    from switchyard.state import state_from_settings

    failures = 0
    bus = bus_from_settings(settings)
    try:
        await bus.start()
        info = await bus.ping()
        where = settings.kafka_bootstrap if settings.bus == "kafka" else "in-process"
        print(
            f"bus ({settings.bus}) at {where}: ok, cluster {info.cluster_id}, brokers {list(info.broker_ids)}"
        )
    except SwitchyardError as exc:
        failures += 1
        print(f"bus ({settings.bus}): unavailable: {exc}", file=sys.stderr)
    finally:
        await bus.stop()
    state = state_from_settings(settings)
    try:
        await state.ping()
        where = redact_url(settings.redis_url) if settings.state == "redis" else "in-process"
        print(f"state ({settings.state}) at {where}: ok")
    except SwitchyardError as exc:
        failures += 1
        print(f"state ({settings.state}): unavailable: {exc}", file=sys.stderr)
    finally:
        await state.close()
    return EXIT_UNAVAILABLE if failures else 0


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    return event_loop.run(_check(settings))


async def _topics(settings: Settings) -> int:
    from switchyard.bus import bus_from_settings
    from switchyard.contracts.topics import ALL_TOPICS

    bus = bus_from_settings(settings)
    try:
        await bus.start()  # creates the topics that are missing
        for topic in ALL_TOPICS:
            name = bus.topic_name(topic)
            partitions = await bus.transport.partitions_for(name)
            print(
                f"{name:45} {partitions:4d} partitions  {topic.type_names:22} {topic.description}"
            )
    finally:
        await bus.stop()
    return 0


def cmd_topics(settings: Settings, args: argparse.Namespace) -> int:
    return event_loop.run(_topics(settings))


async def _dead_letters(settings: Settings, limit: int, idle_s: float) -> int:
    from switchyard.bus import bus_from_settings
    from switchyard.contracts.topics import DEAD_LETTERS

    bus = bus_from_settings(settings)
    shown = 0
    try:
        await bus.start()
        # A fresh group reads the topic from its start and leaves everyone else's offsets be.
        group = f"switchyard-cli-{uuid.uuid4().hex[:8]}"
        async with bus.subscribe(DEAD_LETTERS, group=group) as subscription:
            while shown < limit:
                delivery = await subscription.next_within(idle_s)
                if delivery is None:
                    break
                letter = delivery.message
                print(
                    json.dumps(
                        {
                            "source": f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}",
                            "group": letter.consumer_group,
                            "reason_kind": letter.reason_kind,
                            "reason": letter.reason,
                            "bytes": len(letter.original_value()),
                        }
                    )
                )
                shown += 1
    finally:
        await bus.stop()
    print(f"{shown} dead letter(s)", file=sys.stderr)
    return 0


def cmd_dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    return event_loop.run(_dead_letters(settings, args.limit, args.idle_s))
