"""The live stack as separate OS processes, for failure tests and benchmarks.

Each service is ``python -m cli service NAME`` (what the ``switchyard`` console script runs) in a process of its own, configured
only by ``SWITCHYARD_*`` variables (bus ``kafka``, state ``redis``, a topic and key
prefix of the stack's own, an instance id per process), exactly as a process supervisor
would run it. Its stderr goes to ``{log_dir}/{name}.log`` for post-mortems.

Typical use::

    stack = ProcessStack(kafka_bootstrap, redis_url, prefix, log_dir)
    stack.start_service("monitor")
    stack.start_service("scheduler")
    stack.start_worker("worker-a")
    stack.start_worker("worker-b")
    stack.start_service("ingress")
    await stack.wait_ready(workers=2)
    ...
    killed_at_s = stack.kill("worker-a")     # SIGKILL, wall time of the kill
    ...
    await stack.close()                       # SIGTERM, SIGKILL after a timeout

The ingress's HTTP port is chosen here (a socket bound to port 0, then closed) and handed
to it as ``SWITCHYARD_HTTP_PORT``; each ingress replica (``start_service("ingress",
name=...)``) gets a port of its own, :meth:`ProcessStack.url_of` names one (``url`` is
the first's). Health endpoints take free ports (``0``) unless ``env`` sets one.

Failure detection on these stacks: workers heartbeat every ``heartbeat_interval_s`` and
the monitor declares one down after ``worker_timeout_s`` of silence, checking every
``min(heartbeat_interval_s, worker_timeout_s / 4)`` (:mod:`services.monitor.service`).
With the defaults here (0.25 s, 1.5 s) a killed worker is declared down between about
1.5 and 2.0 s after its kill (its last heartbeat may be up to 0.25 s older than the kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar, cast

import httpx
from switchyard.bus import Envelope, codec
from switchyard.config import Settings, load_settings
from switchyard.contracts.base import Message
from switchyard.contracts.topics import ALL_TOPICS, Topic
from switchyard.state import StateStore, keys, state_from_settings

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HEARTBEAT_INTERVAL_S = 0.25
DEFAULT_WORKER_TIMEOUT_S = 1.5
DEFAULT_PROFILE = "a100-80gb/llama-2-7b"

M = TypeVar("M", bound=Message)
T = TypeVar("T")
K = TypeVar("K")


StackFactory = Callable[..., "ProcessStack"]
"""Makes a :class:`ProcessStack` under a fresh prefix (the ``process_stack`` fixture)."""


class StackError(RuntimeError):
    """The process stack did not come up (the message includes the logs' last lines)."""


_EPHEMERAL_RANGE_PATH = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LISTEN_PORTS_FLOOR = 20000
_handed_out: set[int] = set()


def _ephemeral_floor() -> int:
    """The lowest port the kernel gives outgoing connections (32768 when unknown)."""
    try:
        return int(_EPHEMERAL_RANGE_PATH.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, for a process started after this returns.

    Chosen below the kernel's ephemeral range: a port that the kernel handed out (bound to
    0, then released) can go to any outgoing connection, a Kafka or Redis client's, in the
    moment before the service binds it, and the service then fails with "address already
    in use". Never the same port twice in one process.
    """
    return free_ports(1, host)


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports, chosen as :func:`free_port` does."""
    ceiling = _ephemeral_floor() - count
    floor = min(_LISTEN_PORTS_FLOOR, ceiling // 2)
    rng = random.Random()
    for _ in range(1000):
        first = rng.randrange(floor, ceiling)
        wanted = range(first, first + count)
        if any(port in _handed_out for port in wanted):
            continue
        if all(_bindable(host, port) for port in wanted):
            _handed_out.update(wanted)
            return first
    raise StackError(f"no {count} free consecutive ports on {host} between {floor} and {ceiling}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class ServiceProcess:
    """One running service process."""

    name: str
    service: str
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    started_s: float
    killed_at_s: float | None = None
    argv_prefix: tuple[str, ...] = ()
    """What the command was run under (``setpriv`` for another user, say)."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class ProcessStack:
    """Services as processes over one Kafka and one Redis, under a prefix of their own.

    Args:
        kafka_bootstrap / redis_url: the real broker and state store.
        prefix: unique per stack; topics are ``{prefix}.switchyard.*``, keys
            ``{prefix}:...``.
        log_dir: where each process's stderr goes (``{name}.log``).
        heartbeat_interval_s / worker_timeout_s: the failure-detection settings.
        time_scale: the emulated workers' speed-up (one setting for the whole stack).
        llm_policy: the scheduler's LLM policy.
        extra_env: more ``SWITCHYARD_*`` variables for every process.
    """

    kafka_bootstrap: str
    redis_url: str
    prefix: str
    log_dir: Path
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S
    time_scale: float = 20.0
    llm_policy: str = "jsq"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    http_port: int | None = None
    """The first ingress replica's port (``url``)."""
    http_ports: dict[str, int] = field(default_factory=dict)
    """Every ingress replica's port, by process name."""
    _state: StateStore | None = None
    _closed: bool = False

    def __post_init__(self) -> None:
        self.prefix = self.prefix.rstrip(".:")
        self.log_dir.mkdir(parents=True, exist_ok=True)

    # -- configuration -------------------------------------------------------------------

    @property
    def topic_prefix(self) -> str:
        return f"{self.prefix}."

    @property
    def state_prefix(self) -> str:
        return f"{self.prefix}:"

    def base_env(self) -> dict[str, str]:
        """The variables every process of this stack gets (before its own)."""
        return {
            "SWITCHYARD_BUS": "kafka",
            "SWITCHYARD_STATE": "redis",
            "SWITCHYARD_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "SWITCHYARD_REDIS_URL": self.redis_url,
            "SWITCHYARD_TOPIC_PREFIX": self.topic_prefix,
            "SWITCHYARD_STATE_PREFIX": self.state_prefix,
            "SWITCHYARD_HEALTH_HOST": "127.0.0.1",
            "SWITCHYARD_HEALTH_PORT": "0",
            "SWITCHYARD_LOG_LEVEL": "WARNING",
            "SWITCHYARD_LOG_FORMAT": "text",
            "SWITCHYARD_HEARTBEAT_INTERVAL_S": repr(self.heartbeat_interval_s),
            "SWITCHYARD_WORKER_TIMEOUT_S": repr(self.worker_timeout_s),
            "SWITCHYARD_WORKER_TIME_SCALE": repr(self.time_scale),
            "SWITCHYARD_LLM_POLICY": self.llm_policy,
            "SWITCHYARD_DRAIN_TIMEOUT_S": "5",
            **self.extra_env,
        }

    def settings(self) -> Settings:
        """The stack's settings as this (test) process reads them."""
        return load_settings(self.base_env())

    # -- starting ------------------------------------------------------------------------

    def start_service(
        self,
        service: str,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        argv_prefix: Sequence[str] = (),
    ) -> ServiceProcess:
        """Start ``switchyard service SERVICE`` as process ``name`` (default: the service's
        name); ``env`` adds or overrides variables; ``argv_prefix`` runs the command under
        another (``setpriv --reuid ...``, say)."""
        name = name or service
        if name in self.processes and self.processes[name].running():
            raise StackError(f"process {name!r} is already running")
        full = {
            key: value for key, value in os.environ.items() if not key.startswith("SWITCHYARD_")
        }
        own = {**self.base_env(), "SWITCHYARD_INSTANCE_ID": f"{self.prefix}-{name}"}
        if service == "ingress":
            port = self.http_ports.get(name) or free_port()
            self.http_ports[name] = port
            if self.http_port is None:
                self.http_port = port
            own["SWITCHYARD_HTTP_HOST"] = "127.0.0.1"
            own["SWITCHYARD_HTTP_PORT"] = str(port)
        own.update(env or {})
        full.update(own)
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log_file:
            popen = subprocess.Popen(
                [*argv_prefix, sys.executable, "-m", "cli", "service", service],
                env=full,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        process = ServiceProcess(
            name, service, own, log_path, popen, time.time(), argv_prefix=tuple(argv_prefix)
        )
        self.processes[name] = process
        return process

    def restart(self, name: str) -> ServiceProcess:
        """Start process ``name`` again (after it was killed or exited), as it was started:
        the same service, variables (its instance or worker id, an ingress's port) and
        prefix, as a process supervisor restarts a service."""
        old = self.processes[name]
        if old.running():
            raise StackError(f"process {name!r} is still running")
        return self.start_service(old.service, name, old.env, old.argv_prefix)

    def start_worker(
        self,
        worker_id: str,
        profile: str = DEFAULT_PROFILE,
        env: Mapping[str, str] | None = None,
        argv_prefix: Sequence[str] = (),
    ) -> ServiceProcess:
        """Start an emulated LLM worker called ``worker_id`` (also its process name)."""
        own = {
            "SWITCHYARD_WORKER_ID": worker_id,
            "SWITCHYARD_WORKER_BACKEND": "emulated-llm",
            "SWITCHYARD_WORKER_PROFILE": profile,
            **(env or {}),
        }
        return self.start_service("worker", name=worker_id, env=own, argv_prefix=argv_prefix)

    def start_models_worker(
        self, worker_id: str, env: Mapping[str, str] | None = None
    ) -> ServiceProcess:
        """Start an emulated multi-model node called ``worker_id`` (also its process name)
        with the compose file's resource vector (16 cores, 2 GPUs, 128 GiB of host memory):
        it serves pipeline stages of the models the placement service orders it to load."""
        own = {
            "SWITCHYARD_WORKER_ID": worker_id,
            "SWITCHYARD_WORKER_BACKEND": "emulated-models",
            "SWITCHYARD_WORKER_CPU_CORES": "16",
            "SWITCHYARD_WORKER_GPUS": "2",
            "SWITCHYARD_WORKER_HOST_MEM_GIB": "128",
        }
        return self.start_service("worker", name=worker_id, env={**own, **(env or {})})

    def start_torch_worker(
        self, worker_id: str, env: Mapping[str, str] | None = None
    ) -> ServiceProcess:
        """Start a worker running the real torch models (the classification variants
        and the tiny language model) called ``worker_id`` (also its process name)."""
        own = {"SWITCHYARD_WORKER_ID": worker_id, "SWITCHYARD_WORKER_BACKEND": "torch"}
        return self.start_service("worker", name=worker_id, env={**own, **(env or {})})

    @property
    def url(self) -> str:
        if self.http_port is None:
            raise StackError("no ingress was started")
        return f"http://127.0.0.1:{self.http_port}"

    def url_of(self, name: str) -> str:
        """The base URL of ingress replica ``name`` (its process name)."""
        if name not in self.http_ports:
            raise StackError(f"no ingress replica {name!r} was started")
        return f"http://127.0.0.1:{self.http_ports[name]}"

    @property
    def state(self) -> StateStore:
        """A client of the stack's state store (closed by :meth:`close`)."""
        if self._state is None:
            self._state = state_from_settings(self.settings())
        return self._state

    async def wait_ready(self, workers: int, timeout_s: float = 90.0) -> float:
        """Wait until every ingress replica answers ``/healthz`` and ``workers`` workers
        are in the ``workers`` set; returns the seconds it took.

        Raises:
            StackError: a process exited, or the stack was not ready in time.
        """
        began = time.monotonic()
        deadline = began + timeout_s
        unhealthy = set(self.http_ports)
        registered = 0
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                for process in self.processes.values():
                    if process.killed_at_s is None and not process.running():
                        raise StackError(
                            f"{process.name} exited with {process.popen.returncode} while the "
                            f"stack was starting:\n{process.log_tail()}"
                        )
                for name in sorted(unhealthy):
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"{self.url_of(name)}/healthz")).status_code == 200:
                            unhealthy.discard(name)
                healthy = not unhealthy
                registered = await self.state.zcard(keys.WORKERS)
                # The monitor has restored the answers (calls naming their id accepted).
                restored = await self.state.get(keys.STATE_GENERATION) is not None
                if healthy and registered >= workers and restored:
                    return time.monotonic() - began
                if time.monotonic() > deadline:
                    raise StackError(
                        f"stack not ready within {timeout_s:g} s (ingress healthy: {healthy}; "
                        f"{registered} of {workers} workers registered; answers restored: "
                        f"{restored})\n{self.logs()}"
                    )
                await asyncio.sleep(0.1)

    async def wait_group(self, group: str, members: int, timeout_s: float = 30.0) -> None:
        """Wait until consumer group ``group`` (without the prefix, e.g. ``scheduler``) is
        stable with ``members`` members: its partitions are shared out."""
        deadline = time.monotonic() + timeout_s
        seen: tuple[str, int] = ("", 0)
        while time.monotonic() < deadline:
            seen = await group_state(self.kafka_bootstrap, self.topic_prefix + group)
            if seen == ("Stable", members):
                return
            await asyncio.sleep(0.2)
        raise StackError(f"group {group} not stable with {members} members: {seen}")

    async def live_workers(self) -> list[str]:
        """Worker ids whose ``worker:{id}`` status is ``alive``."""
        members = await self.state.zrange_by_score("workers", -math.inf, math.inf)
        alive = []
        for worker_id, _ in members:
            if await self.state.hget(f"worker:{worker_id}", "status") == "alive":
                alive.append(worker_id)
        return alive

    # -- failures and stopping -------------------------------------------------------------

    def kill(self, name: str) -> float:
        """SIGKILL process ``name``; returns the wall time (``time.time()``) of the kill."""
        process = self.processes[name]
        process.popen.send_signal(signal.SIGKILL)
        killed_at_s = time.time()
        process.killed_at_s = killed_at_s
        process.popen.wait(timeout=10)
        return killed_at_s

    def terminate(self, name: str) -> float:
        """SIGTERM process ``name`` (it drains and exits on its own; not waited for);
        returns the wall time of the signal."""
        self.processes[name].popen.send_signal(signal.SIGTERM)
        return time.time()

    def stop(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM every running process, SIGKILL those still running after
        ``timeout_s``; returns each process's exit code."""
        for process in self.processes.values():
            if process.running():
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            left = max(0.1, deadline - time.monotonic())
            try:
                process.popen.wait(timeout=left)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGKILL)
                process.popen.wait(timeout=10)
        return {name: p.popen.returncode for name, p in self.processes.items()}

    async def close(self, *, delete_topics: bool = True) -> dict[str, int | None]:
        """:meth:`stop`, then delete the stack's topics and keys (best effort)."""
        if self._closed:
            return {name: p.popen.returncode for name, p in self.processes.items()}
        self._closed = True
        codes = self.stop()
        if self._state is not None:
            with contextlib.suppress(Exception):
                await self._state.clear_prefix()
            with contextlib.suppress(Exception):
                await self._state.close()
            self._state = None
        if delete_topics:
            with contextlib.suppress(Exception):
                await delete_stack_topics(self.kafka_bootstrap, self.topic_prefix)
        return codes

    def logs(self, lines: int = 15) -> str:
        """The last lines of every process's log, for failure messages."""
        parts = []
        for process in self.processes.values():
            code = process.popen.poll()
            parts.append(
                f"--- {process.name} (pid {process.pid}, exit {code}) ---\n"
                f"{process.log_tail(lines)}"
            )
        return "\n".join(parts)


# -- reading topics back -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record(Generic[T]):
    """One record read back from a topic: the message and the broker's timestamp."""

    message: T
    partition: int
    offset: int
    timestamp_ms: int


async def read_topic(
    kafka_bootstrap: str, topic_prefix: str, topic: Topic[M], timeout_s: float = 20.0
) -> list[Record[M]]:
    """Every record of ``topic`` (under ``topic_prefix``) from the beginning to the end
    offsets as of now, decoded; no consumer group, so nothing is committed.

    Equivalent to a fresh consumer group reading from the earliest offset, without the
    group join's delay.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    name = topic_prefix + topic.name
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([name])
    finally:
        await admin.close()
    partitions = sorted(
        int(p["partition"]) for d in described if d.get("error_code") == 0 for p in d["partitions"]
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    try:
        assigned = [TopicPartition(name, p) for p in partitions]
        if not assigned:
            return []
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        records: list[Record[M]] = []
        deadline = time.monotonic() + timeout_s
        while [tp for tp in assigned if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {name} to its end within {timeout_s:g} s")
            batches = await consumer.getmany(timeout_ms=500)
            for tp, rows in batches.items():
                for row in rows:
                    if row.offset >= ends[tp] or row.value is None:
                        continue
                    envelope = Envelope(
                        topic=name,
                        partition=tp.partition,
                        offset=row.offset,
                        key=row.key,
                        value=row.value,
                        headers=tuple(row.headers or ()),
                        timestamp_ms=row.timestamp,
                    )
                    message = cast(M, codec.decode(envelope, topic.message_types))
                    records.append(Record(message, tp.partition, row.offset, row.timestamp))
        return records
    finally:
        await consumer.stop()


async def group_state(kafka_bootstrap: str, group_id: str) -> tuple[str, int]:
    """The state of consumer group ``group_id`` (``Stable``, ``PreparingRebalance``, ...)
    and its number of members."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group_id])
    finally:
        await admin.close()
    for response in responses:
        for group in response.groups:
            # (error_code, group_id, state, protocol_type, protocol, members, ...)
            if group[1] == group_id:
                return str(group[2]), len(group[5])
    return "", 0


async def delete_stack_topics(kafka_bootstrap: str, topic_prefix: str) -> None:
    """Delete every Switchyard topic under ``topic_prefix``."""
    from switchyard.bus.kafka import KafkaTransport

    transport = KafkaTransport(kafka_bootstrap, client_id=f"{topic_prefix}cleaner")
    await transport.start()
    try:
        await transport.delete_topics(topic_prefix + t.name for t in ALL_TOPICS)
    finally:
        await transport.stop()


async def gather_bounded(calls: Sequence[Awaitable[T]], limit: int = 64) -> list[T]:
    """``asyncio.gather`` with at most ``limit`` awaiting at once (a store's or an HTTP
    client's connection pool is finite: ten thousand reads at once exhaust it)."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


def count_by(keys: Sequence[K]) -> dict[K, int]:
    """How many times each key occurs."""
    counts: dict[K, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts
