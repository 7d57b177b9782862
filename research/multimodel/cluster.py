"""Heterogeneous clusters of workers: sampled from the Alibaba GPU node list, or synthetic.

Where the Alibaba files are read from (:func:`alibaba_trace_dir`): the directory
``$SWITCHYARD_TRACE_DIR/alibaba`` when ``SWITCHYARD_TRACE_DIR`` is set (a missing file
there is an error, not a silent fallback), else ``<repository root>/../shared/traces/alibaba``
when it exists, else the small samples bundled in ``shared/switchyard/traces/data/`` stand in (see
``shared/switchyard/traces/data/README.md`` for their source, selection and licence words).

Worker capacity from a node row (``sn,cpu_milli,memory_mib,gpu,model``):
``cpu = cpu_milli / 1000`` cores, ``gpu = gpu`` whole GPUs, ``mem_gib = memory_mib / 1024``;
``gpu_type`` is the ``model`` column and ``speed`` comes from :data:`GPU_SPEEDS`.
Nodes without a GPU (``gpu = 0``) are skipped: they cannot serve the GPU models.
"""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass
from pathlib import Path

from switchyard.multimodel.model import ResourceVector, WorkerSpec
from switchyard.traces.alibaba import (
    SHARED_ALIBABA_DIR,
    TraceFileError,
    alibaba_trace_dir,
    alibaba_trace_file,
)
from switchyard.traces.azure import BUNDLED_DIR
from switchyard.traces.sources import TRACE_DIR_ENV

__all__ = [
    "ALIBABA_NODE_FILE",
    "ALIBABA_NODE_SAMPLE",
    "BUNDLED_DATA_DIR",
    "DEFAULT_SPEED",
    "FAST_TYPE",
    "GPU_SPEEDS",
    "SHARED_ALIBABA_DIR",
    "SLOW_SPEED_MAX",
    "SLOW_TYPE",
    "TRACE_DIR_ENV",
    "AlibabaNode",
    "TraceFileError",
    "alibaba_cluster",
    "alibaba_trace_dir",
    "alibaba_trace_file",
    "gpu_speed",
    "read_alibaba_nodes",
    "synthetic_cluster",
]

BUNDLED_DATA_DIR = BUNDLED_DIR
ALIBABA_NODE_FILE = "gpu-v2023_openb_node_list_all_node.csv"
ALIBABA_NODE_SAMPLE = BUNDLED_DATA_DIR / "alibaba_node_sample.csv"

GPU_SPEEDS: dict[str, float] = {
    "T4": 1.0,
    "P100": 1.3,
    "V100M16": 2.0,
    "V100M32": 2.0,
    "A10": 2.5,
    "G2": 2.5,
    "G3": 3.0,
}
"""Relative serving throughput per GPU type, T4 = 1.0 (a worker serves a model in
``exec_s / speed``).

These are approximations, not measurements of this system: T4, P100 and V100 follow the
rough ratio of their FP16 inference throughput on diffusion/CNN models in public
benchmarks (NVIDIA's data-centre inference results and community Stable Diffusion
it/s tables: P100 has no tensor cores and lands a little above a T4, a V100 about twice
a T4, an A10 a little above a V100). ``G2`` and ``G3`` are Alibaba's undisclosed GPU
models in the 2023 trace (Weng et al., ATC'23, do not name them); **assumed** here:
``G2`` an A10-class GPU (2.5) and ``G3`` a newer, faster one (3.0), in line with their
nodes (8 GPUs, 96 and 128 cores)."""

DEFAULT_SPEED = 1.0
"""Speed of a GPU type missing from :data:`GPU_SPEEDS` (treated as T4-class)."""

SLOW_SPEED_MAX = 1.3
"""GPU types with a speed at most this are the *slow* pool of :func:`alibaba_cluster`'s
``heterogeneity`` (T4, P100); the others are the *fast* pool."""


@dataclass(frozen=True, slots=True)
class _WorkerType:
    gpu_type: str
    capacity: ResourceVector
    speed: float


SLOW_TYPE = _WorkerType("T4", ResourceVector(32.0, 4.0, 128.0), GPU_SPEEDS["T4"])
"""The slow worker of :func:`synthetic_cluster`: 4 T4-class GPUs (speed 1.0)."""
FAST_TYPE = _WorkerType("V100M32", ResourceVector(32.0, 4.0, 128.0), GPU_SPEEDS["V100M32"])
"""The fast worker of :func:`synthetic_cluster`: 4 V100-class GPUs (speed 2.0), the same
capacity as the slow one, so the two types differ in speed only."""


@dataclass(frozen=True, slots=True)
class AlibabaNode:
    """One row of the node list."""

    sn: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str


def gpu_speed(gpu_type: str) -> float:
    """The relative speed of ``gpu_type`` (:data:`GPU_SPEEDS`, else :data:`DEFAULT_SPEED`)."""
    return GPU_SPEEDS.get(gpu_type, DEFAULT_SPEED)


def read_alibaba_nodes(path: str | os.PathLike[str]) -> tuple[AlibabaNode, ...]:
    """Every row of a node-list CSV (``sn,cpu_milli,memory_mib,gpu,model``), in file order.

    Raises:
        TraceFileError: naming the file (and line) for a missing file, a missing column
            or a value that is not a non-negative integer.
    """
    file = Path(path)
    try:
        handle = file.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceFileError(f"Alibaba node list {file}: cannot read: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = {"sn", "cpu_milli", "memory_mib", "gpu", "model"} - set(reader.fieldnames or ())
        if missing:
            raise TraceFileError(
                f"Alibaba node list {file}: missing column(s) {', '.join(sorted(missing))}"
            )
        nodes = []
        for row in reader:
            try:
                values = [int(row[key]) for key in ("cpu_milli", "memory_mib", "gpu")]
            except (TypeError, ValueError):
                raise TraceFileError(
                    f"Alibaba node list {file} line {reader.line_num}: cpu_milli, memory_mib "
                    "and gpu must be integers"
                ) from None
            if min(values) < 0:
                raise TraceFileError(
                    f"Alibaba node list {file} line {reader.line_num}: negative capacity"
                )
            cpu_milli, memory_mib, gpu = values
            nodes.append(
                AlibabaNode(row["sn"], cpu_milli, memory_mib, gpu, (row["model"] or "").strip())
            )
    return tuple(nodes)


def _worker(node: AlibabaNode, copy: int) -> WorkerSpec:
    return WorkerSpec(
        worker_id=node.sn if copy == 0 else f"{node.sn}#{copy}",
        gpu_type=node.model or "unknown",
        capacity=ResourceVector(node.cpu_milli / 1000.0, float(node.gpu), node.memory_mib / 1024.0),
        speed=gpu_speed(node.model),
    )


def _draw(pool: list[AlibabaNode], count: int, rng: random.Random) -> list[tuple[AlibabaNode, int]]:
    """``count`` nodes without replacement; past the pool's size, further rounds over it
    (a node drawn again becomes a new worker ``sn#k``)."""
    drawn: list[tuple[AlibabaNode, int]] = []
    copy = 0
    while len(drawn) < count:
        round_ = list(pool)
        rng.shuffle(round_)
        drawn += [(node, copy) for node in round_[: count - len(drawn)]]
        copy += 1
    return drawn


def _check_count(n_workers: int) -> None:
    if n_workers < 1:
        raise ValueError(f"n_workers: must be >= 1, got {n_workers}")


def _check_ratio(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: must be within [0, 1], got {value!r}")


def alibaba_cluster(
    n_workers: int,
    seed: int,
    heterogeneity: float | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> tuple[WorkerSpec, ...]:
    """``n_workers`` workers sampled from the Alibaba GPU nodes (GPU-less nodes skipped).

    Args:
        n_workers: how many workers; past the number of GPU nodes, nodes are drawn again
            (worker ids ``sn#1``, ``sn#2``, ...).
        seed: the sample (and the order of the workers) depends only on it.
        heterogeneity: ``None`` draws uniformly from all GPU nodes (the trace's own mix).
            A value ``h`` in [0, 1] draws ``round(h * n_workers)`` workers from the slow
            pool (types with speed <= :data:`SLOW_SPEED_MAX`: T4, P100) and the rest
            from the fast pool (V100, A10, G2, G3), in shuffled positions; as in
            :func:`synthetic_cluster`, 0 and 1 are single-pool clusters.
        path: the node-list CSV; default :func:`alibaba_trace_file` (the full list, else
            the bundled sample).

    Raises:
        ValueError: for ``n_workers < 1`` or ``heterogeneity`` outside [0, 1], or a pool
            that is needed but holds no node.
        TraceFileError: for a missing or malformed file.
    """
    _check_count(n_workers)
    file = (
        Path(path)
        if path is not None
        else alibaba_trace_file(ALIBABA_NODE_FILE, ALIBABA_NODE_SAMPLE)
    )
    nodes = [node for node in read_alibaba_nodes(file) if node.gpu > 0]
    if not nodes:
        raise ValueError(f"Alibaba node list {file}: no node with a GPU")
    rng = random.Random(seed)
    if heterogeneity is None:
        drawn = _draw(nodes, n_workers, rng)
    else:
        _check_ratio("heterogeneity", heterogeneity)
        slow = [node for node in nodes if gpu_speed(node.model) <= SLOW_SPEED_MAX]
        fast = [node for node in nodes if gpu_speed(node.model) > SLOW_SPEED_MAX]
        n_slow = round(heterogeneity * n_workers)
        for name, pool, count in (("slow", slow, n_slow), ("fast", fast, n_workers - n_slow)):
            if count and not pool:
                raise ValueError(f"Alibaba node list {file}: no {name} GPU node to draw from")
        drawn = _draw(slow, n_slow, rng) + _draw(fast, n_workers - n_slow, rng)
        rng.shuffle(drawn)
    return tuple(_worker(node, copy) for node, copy in drawn)


def synthetic_cluster(
    n_workers: int, heterogeneity_ratio: float, seed: int
) -> tuple[WorkerSpec, ...]:
    """``n_workers`` workers of two types that differ in speed only.

    ``heterogeneity_ratio`` ``h`` in [0, 1] is the share of workers of the slow type
    (:data:`SLOW_TYPE`, speed 1.0); the other workers are of the fast type
    (:data:`FAST_TYPE`, speed 2.0), both with 32 cores, 4 GPUs and 128 GiB. Exactly
    ``round(h * n_workers)`` workers are slow, at positions drawn with ``seed``. ``h = 0``
    is a homogeneous fast cluster, ``h = 1`` a homogeneous slow one, ``h = 0.5`` the most
    mixed; the total speed falls from ``2 n`` to ``n`` as ``h`` grows. Worker ids are
    ``w00``, ``w01``, ...
    """
    _check_count(n_workers)
    _check_ratio("heterogeneity_ratio", heterogeneity_ratio)
    n_slow = round(heterogeneity_ratio * n_workers)
    slow_positions = set(random.Random(seed).sample(range(n_workers), n_slow))
    width = max(2, len(str(n_workers - 1)))
    workers = []
    for index in range(n_workers):
        kind = SLOW_TYPE if index in slow_positions else FAST_TYPE
        workers.append(
            WorkerSpec(
                worker_id=f"w{index:0{width}d}",
                gpu_type=kind.gpu_type,
                capacity=kind.capacity,
                speed=kind.speed,
            )
        )
    return tuple(workers)
