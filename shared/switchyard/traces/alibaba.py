"""The Alibaba GenAI traces: where their files are read from, and the LoRA request rows.

Where the files are read from (:func:`alibaba_trace_dir`): the directory
``$SWITCHYARD_TRACE_DIR/alibaba`` when ``SWITCHYARD_TRACE_DIR`` is set (a missing file
there is an error, not a silent fallback), else ``<repository root>/../shared/traces/alibaba``
when it exists, else the small samples bundled in ``shared/switchyard/traces/data/`` stand in
(see ``shared/switchyard/traces/data/README.md`` for their source, selection and licence
words). The multi-model workload built from the LoRA rows is
:func:`switchyard.multimodel.alibaba.lora_workload`.
"""

from __future__ import annotations

import csv
import functools
import math
import os
from datetime import datetime
from pathlib import Path

from switchyard.traces.azure import BUNDLED_DIR
from switchyard.traces.sources import REPOSITORY_ROOT, TRACE_DIR_ENV

__all__ = [
    "LORA_FILE",
    "LORA_SAMPLE",
    "SHARED_ALIBABA_DIR",
    "LoraRow",
    "TraceFileError",
    "alibaba_trace_dir",
    "alibaba_trace_file",
    "read_lora_rows",
]

# Next to the repository, not in it, as for the Azure traces (switchyard/traces/sources.py).
SHARED_ALIBABA_DIR = REPOSITORY_ROOT.parent / "shared" / "traces" / "alibaba"
LORA_FILE = "v2026-GenAI_lora_request_trace.csv"
LORA_SAMPLE = BUNDLED_DIR / "alibaba_lora_sample.csv"

_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class TraceFileError(ValueError):
    """An Alibaba trace file that is missing or malformed; the message is one line."""


def alibaba_trace_dir() -> Path | None:
    """Where the full Alibaba traces are read from, or None when only the samples exist."""
    configured = os.environ.get(TRACE_DIR_ENV, "").strip()
    if configured:
        return Path(configured) / "alibaba"
    if SHARED_ALIBABA_DIR.is_dir():
        return SHARED_ALIBABA_DIR
    return None


def alibaba_trace_file(file_name: str, sample: Path) -> Path:
    """The full trace ``file_name`` when a trace directory is found, else ``sample``.

    Raises:
        TraceFileError: when a trace directory is configured or present but lacks the
            file (a run asked for the full trace must not quietly use the sample).
    """
    directory = alibaba_trace_dir()
    if directory is None:
        return sample
    path = directory / file_name
    if not path.is_file():
        raise TraceFileError(
            f"Alibaba trace {path} not found (looked in ${TRACE_DIR_ENV}/alibaba, else "
            f"{SHARED_ALIBABA_DIR}); put {file_name} there or pass the bundled sample "
            f"{sample}"
        )
    return path


class LoraRow:
    """One SUCCEED request of the LoRA trace: when, how long, which base model, and its
    inference steps times images."""

    __slots__ = ("at", "exec_s", "model", "steps")  # steps: inference steps x images

    def __init__(self, at: datetime, exec_s: float, model: str, steps: float) -> None:
        self.at = at
        self.exec_s = exec_s
        self.model = model
        self.steps = steps


@functools.lru_cache(maxsize=4)
def read_lora_rows(file: Path) -> tuple[LoraRow, ...]:
    """The LoRA trace's SUCCEED rows, sorted by time; read once per file and process (a sweep builds
    a workload per setting and seed from the same file)."""
    try:
        handle = file.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceFileError(f"LoRA trace {file}: cannot read: {exc.strerror}") from None
    needed = {
        "gmt_create",
        "predict_status",
        "exec_time_seconds",
        "num_inference_steps",
        "checkpoint_model_version_id",
    }
    rows: list[LoraRow] = []
    with handle:
        reader = csv.DictReader(handle)
        missing = needed - set(reader.fieldnames or ())
        if missing:
            raise TraceFileError(
                f"LoRA trace {file}: missing column(s) {', '.join(sorted(missing))}"
            )
        for row in reader:
            if row["predict_status"] != "SUCCEED":
                continue
            try:
                at = datetime.strptime(row["gmt_create"], _TIME_FORMAT)
                exec_s = float(row["exec_time_seconds"])
                steps = float(row["num_inference_steps"] or "nan") * float(
                    row.get("num_images_per_prompt") or "1"
                )
            except ValueError as exc:
                raise TraceFileError(f"LoRA trace {file} line {reader.line_num}: {exc}") from None
            model = row["checkpoint_model_version_id"].strip()
            if not (math.isfinite(exec_s) and exec_s > 0) or not model:
                raise TraceFileError(
                    f"LoRA trace {file} line {reader.line_num}: a SUCCEED row needs a "
                    "positive exec_time_seconds and a checkpoint_model_version_id"
                )
            rows.append(LoraRow(at, exec_s, model, steps))
    rows.sort(key=lambda r: r.at)  # stable: rows of the same second keep file order
    return tuple(rows)
