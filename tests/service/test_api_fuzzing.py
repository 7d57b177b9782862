"""The HTTP API fuzzed from its own OpenAPI document (Schemathesis), against the embedded
stack with API keys on: generated valid and invalid calls to every operation, and
sequences of them, with zero 5xx answers, every status, header and body as the document
declares, and the stack still serving afterwards.

Bounded (``--max-examples``, deterministic generation) so that it takes well under a
minute; ``SWITCHYARD_FUZZ_EXAMPLES`` asks for more.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.harness.process_stack import free_port
from services.ingress.tenants import hash_key

KEY = "sy-fuzzing-tenant-key"
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ]
)
EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES", "60"))

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``switchyard up --embedded`` with one tenant's key, on a free port."""
    port = free_port()
    logs = tmp_path_factory.mktemp("fuzz") / "stack.log"
    env = {
        **os.environ,
        "SWITCHYARD_AUTH": "api-key",
        "SWITCHYARD_API_KEYS": f"fuzz={hash_key(KEY)}",
        "SWITCHYARD_WORKER_TIME_SCALE": "200",
        "SWITCHYARD_LOG_LEVEL": "WARNING",
    }
    with logs.open("w") as log:
        stack = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--embedded", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert stack.poll() is None, logs.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, logs.read_text()[-4000:]
            time.sleep(0.5)
        yield url
    finally:
        stack.terminate()
        stack.wait(timeout=60)


def test_fuzzed_calls_get_no_5xx_and_answers_as_the_document_declares(
    api: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("st")),
            "run",
            f"{api}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(EXAMPLES),
            "--generation-deterministic",
            "--request-timeout",
            "30",
            "--header",
            f"Authorization: Bearer {KEY}",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
        check=False,
    )
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    generated = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert generated is not None, report
    assert int(generated[1]) == int(generated[2]) >= 500, report
    print(f"\nschemathesis: {generated[0]}")

    # Still serving, and the key is still needed.
    body = {"model": "llama-2-7b", "prompt": "after the fuzzing", "max_tokens": 4}
    served = httpx.post(
        f"{api}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert served.status_code == 200, served.text
    assert httpx.post(f"{api}/v1/completions", json=body, timeout=10).status_code == 401
