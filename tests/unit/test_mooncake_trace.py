"""The Mooncake-format trace reader: what it reads, and a clear line for each bad row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from switchyard.traces import PREFIX_BLOCK_TOKENS, TraceFormatError, resolve_trace


def write(path: Path, *rows: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def row(ms: float, prompt: int, output: int, ids: list[int] | None = None) -> dict[str, object]:
    blocks = ids if ids is not None else list(range(-(-prompt // PREFIX_BLOCK_TOKENS)))
    return {"timestamp": ms, "input_length": prompt, "output_length": output, "hash_ids": blocks}


def test_the_bundled_sample_keeps_its_shared_prefixes() -> None:
    trace = resolve_trace("mooncake-sample")
    assert len(trace) == 1000
    assert trace.requests[0].arrival_s == 0.0
    for request in trace.requests:
        assert len(request.prefix_blocks) == -(-request.prompt_tokens // PREFIX_BLOCK_TOKENS)
    firsts = [r.prefix_blocks[0] for r in trace.requests]
    assert len(set(firsts)) < len(firsts)  # some requests share a leading block


def test_a_jsonl_path_is_read_in_seconds_with_its_blocks(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", row(1000, 600, 5, [7, 8]), row(2500, 512, 3, [7]))
    trace = resolve_trace(str(path))
    first, second = trace.requests
    assert (first.arrival_s, second.arrival_s) == (0.0, 1.5)
    assert (first.prompt_tokens, first.output_tokens, first.prefix_blocks) == (600, 5, (7, 8))
    assert second.prefix_blocks == (7,)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        (json.dumps({"timestamp": 5, "input_length": 3, "output_length": 1}), "hash_ids: missing"),
        (json.dumps(row(-1, 10, 1)), "timestamp: must be a number"),
        (json.dumps(row(5, 0, 1, [])), "input_length: must be a positive integer"),
        (json.dumps(row(5, 10, 1.5)), "output_length: must be a positive integer"),  # type: ignore[arg-type]
        (json.dumps(row(5, 1000, 1, [1])), "hash_ids: 1 ids for 1000 prompt tokens; expected 2"),
        (json.dumps(row(5, 10, 1, [-3])), "hash_ids: must be a list of integers"),
        (json.dumps(row(0.5, 10, 1)), "timestamp: goes backwards"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, line: str, named: str) -> None:
    path = write(tmp_path / "bad.jsonl", row(1, 10, 1), line)
    with pytest.raises(TraceFormatError) as caught:
        resolve_trace(str(path))
    message = str(caught.value)
    assert "bad.jsonl" in message
    assert named in message
    assert "\n" not in message


def test_an_empty_or_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no requests"):
        resolve_trace(str(write(tmp_path / "empty.jsonl", "")))
    with pytest.raises(TraceFormatError, match="no such file"):
        resolve_trace(str(tmp_path / "missing.jsonl"))
