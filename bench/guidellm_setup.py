"""What guidellm needs before a run, cached under ``~/.cache/switchyard/``: its own virtual
environment (``guidellm-venv``, ``pip install guidellm==0.8.1`` when missing) and the
stand-in tokenizer it sizes prompts with (``guidellm-tokenizer``, a byte-level BPE trained
once on Faker's English, the text guidellm's prompts are made of, since the Hugging Face
hub is not reachable here). Also the benchmark's error and the tail of a log it quotes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CACHE = Path.home() / ".cache" / "switchyard"
GUIDELLM_VERSION = "0.8.1"
DEFAULT_VENV = CACHE / "guidellm-venv"
DEFAULT_TOKENIZER = CACHE / "guidellm-tokenizer"
INSTALL_RECORD = "switchyard-install.json"
STAND_IN_RECORD = "stand-in.json"
TOKENIZER_VOCAB = 2000
"""Vocabulary of the stand-in BPE: about 4.1 bytes a token on Faker's English, close to
the ingress's four and to what Llama-class tokenizers give on English text."""
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""Environment for the guidellm environment's processes: no reach for the Hugging Face hub."""

# Run by the guidellm environment's Python (tokenizers, transformers and faker are there).
TOKENIZER_SCRIPT = """
import json, sys
from faker import Faker
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out, vocab = sys.argv[1], int(sys.argv[2])
faker = Faker()
faker.seed_instance(0)
texts = [faker.text(max_nb_chars=2000) for _ in range(2000)]
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
    vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    special_tokens=["<|endoftext|>"], show_progress=False))
fast = PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
    unk_token="<|endoftext|>", model_max_length=32768)
fast.save_pretrained(out)
faker.seed_instance(1)
held_out = " ".join(faker.text(max_nb_chars=2000) for _ in range(200))
bytes_per_token = len(held_out.encode()) / len(fast.encode(held_out))
record = {
    "what": "stand-in tokenizer for guidellm's prompt sizing, not a model's tokenizer",
    "trained_on": "2,000 Faker en_US texts (seed 0), the text guidellm's prompts are made of",
    "kind": "byte-level BPE", "vocab_size": vocab,
    "bytes_per_token_held_out": bytes_per_token,
}
with open(f"{out}/stand-in.json", "w") as handle:
    json.dump(record, handle, indent=2)
"""


class BenchError(Exception):
    """A state the benchmark cannot go on from; its message is the one line shown."""


def log_tail(path: Path, lines: int = 1) -> str:
    """The last ``lines`` lines of the log at ``path``, joined by `` | ``; "" if unreadable."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def _tree_bytes(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink():
                with contextlib.suppress(OSError):
                    total += path.stat().st_size
    return total


def ensure_guidellm(venv: Path, *, install: bool, log: Path) -> dict[str, Any]:
    """The guidellm environment at ``venv``: created and installed when missing (and
    ``install``), checked by ``guidellm --version``; what it is and what it cost."""
    binary = venv / "bin" / "guidellm"
    record_path = venv / INSTALL_RECORD
    if not binary.exists():
        if not install:
            raise BenchError(f"guidellm is not installed in {venv} (run without --no-install)")
        print(
            f"installing guidellm=={GUIDELLM_VERSION} into {venv} (once: torch and its CUDA "
            "libraries come with it, about 6 GB; a few minutes)",
            flush=True,
        )
        started = time.monotonic()
        with log.open("w") as handle:
            steps = (
                [sys.executable, "-m", "venv", "--clear", str(venv)],
                [str(venv / "bin" / "pip"), "install", f"guidellm=={GUIDELLM_VERSION}"],
            )
            for step in steps:
                step_done = subprocess.run(
                    step, stdout=handle, stderr=subprocess.STDOUT, check=False
                )
                if step_done.returncode != 0:
                    raise BenchError(
                        f"installing guidellm failed ({' '.join(step[-2:])}: exit "
                        f"{step_done.returncode}): {log_tail(log)} (log: {log})"
                    )
        record = {
            "version": GUIDELLM_VERSION,
            "install_s": round(time.monotonic() - started, 1),
            "size_bytes": _tree_bytes(venv),
        }
        record_path.write_text(json.dumps(record, indent=2))
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"{binary} does not run: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BenchError(f"{binary} --version failed (exit {done.returncode}): {last[0]}")
    version = done.stdout.strip().rsplit(" ", 1)[-1]
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    if "size_bytes" not in record:
        record["size_bytes"] = _tree_bytes(venv)
        record_path.write_text(json.dumps(record, indent=2))
    return {
        "venv": str(venv),
        "version": version,
        "install_s": record.get("install_s"),
        "venv_size_bytes": record["size_bytes"],
    }


def ensure_tokenizer(venv: Path, directory: Path) -> dict[str, Any]:
    """The stand-in tokenizer in ``directory``, trained once by the guidellm environment;
    its record (``stand-in.json``) with its ``path``."""
    record = directory / STAND_IN_RECORD
    if not (directory / "tokenizer.json").exists() or not record.exists():
        directory.mkdir(parents=True, exist_ok=True)
        print(f"training the stand-in tokenizer into {directory} (once, seconds)", flush=True)
        done = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                TOKENIZER_SCRIPT,
                str(directory),
                str(TOKENIZER_VOCAB),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **OFFLINE_ENV},
            check=False,
        )
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise BenchError(f"training the stand-in tokenizer failed: {last[0]}")
    info: dict[str, Any] = json.loads(record.read_text())
    info["path"] = str(directory)
    return info
