"""A third-party benchmark client against the ingress: guidellm beside Switchyard's load
generator, on one trace-like load and one stack.

guidellm (the vLLM project's benchmark tool, ``pip install guidellm``; llm-d's
benchmarking harness drives it too) runs unmodified, through its own command line, from
a virtual environment of its own (``~/.cache/switchyard/guidellm-venv``, created with
``pip install guidellm==0.8.1`` when missing: torch and its CUDA libraries come with it,
about 6 GB and two minutes once). It needs a tokenizer to size its prompts; the Hugging
Face hub is not reachable here, so a stand-in is trained once on the text guidellm's
prompts are made of (Faker's English, a byte-level BPE sized to about four bytes a token,
which is the ingress's own count, ``ceil(UTF-8 bytes / 4)``) and cached in
``~/.cache/switchyard/guidellm-tokenizer``.

Each run starts the embedded stack (``switchyard up --embedded``, emulated LLM workers:
a performance model, not a measurement of GPUs) on a private port and drives it with one
plan, twice: Poisson arrivals at ``--rate`` for ``--duration-s``, prompt and output
lengths resampled from the Azure conversation trace (prompts clipped to
``--max-prompt-tokens``). guidellm replays the plan from a CSV file (its ``replay``
profile, ``schedule_turn=timestamp``, and ``trace_synthetic`` data: the same arrivals and
lengths), streamed, against ``/v1/completions``; ``python -m loadgen replay`` replays the
same plan from an Azure-format CSV file. The order of the two alternates between runs.

Rows of the table, per run:

- ``guidellm, its report``: the percentiles and rates of guidellm's own report (its
  percentiles are nearest-rank, and its ITL distribution weights each request by its
  tokens);
- ``guidellm, per request``: guidellm's per-request figures (client side, streamed):
  TTFT from sending to the first token chunk, ITL ``(last token - first token) /
  (tokens - 1)``, end-to-end from sending to the end of the stream;
- ``stack, guidellm's requests``: the same requests as the stack recorded them
  (``GET /v1/requests/{id}`` with the id of each answer): TTFT ``first_token_s -
  arrival_s``, ITL ``(finished_s - first_token_s) / (tokens - 1)``, end-to-end
  ``finished_s - arrival_s``;
- ``loadgen``: the load generator's records; it reads answers whole (not streamed), so
  its end-to-end latency is the client's and its TTFT and ITL are the stack's timeline
  in each answer (the definitions of the row above); its own report gives the same
  figures.

guidellm's ``poisson`` profile is not used: in 0.8.1 each of its worker processes (10 by
default) draws the same exponential gaps from the same seed, so every gap repeats ten
times in a row (``GUIDELLM__MAX_WORKER_PROCESSES=1`` avoids it). Its ``replay`` profile
takes the arrivals from the plan instead.

Quantiles are numpy's (linear interpolation); throughput is answered requests (and
output tokens) per second from the first request sent to the last answer. Medians over
the runs are printed last. Run ``python -m bench.guidellm_bench`` (``make
bench-guidellm``); JSON in ``bench/results/guidellm/``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from switchyard.errors import SwitchyardError
from switchyard.traces import resolve_trace
from switchyard.traces.azure import Trace
from switchyard.traces.synthetic import ResampledLengths, poisson

from bench.guidellm_report import (
    ClientRun,
    Sample,
    client_minus_stack,
    gap_line,
    median_rows,
    read_guidellm,
    read_loadgen,
    report_row,
    row,
    stack_records,
    table,
    write_document,
)
from bench.guidellm_setup import (
    DEFAULT_TOKENIZER,
    DEFAULT_VENV,
    GUIDELLM_VERSION,
    OFFLINE_ENV,
    BenchError,
    ensure_guidellm,
    ensure_tokenizer,
    log_tail,
)
from bench.proc_cpu import cpu_seconds

RESULTS = Path(__file__).parent / "results" / "guidellm"
IDLE_SAMPLE_S = 5.0
_URL = re.compile(r"HTTP API at (http://\S+)")


# -- the plan ----------------------------------------------------------------------------------


def build_plan(
    rate_rps: float, duration_s: float, seed: int, lengths: str, max_prompt_tokens: int
) -> Trace:
    """Poisson arrivals at ``rate_rps`` for about ``duration_s``, lengths resampled from
    the trace ``lengths`` (prompts clipped to ``max_prompt_tokens``)."""
    source = resolve_trace(lengths)
    requests = max(1, round(rate_rps * duration_s))
    trace = poisson(rate_rps, requests, seed=seed, lengths=ResampledLengths(source))
    clipped = tuple(
        dataclasses.replace(r, prompt_tokens=min(r.prompt_tokens, max_prompt_tokens))
        for r in trace.requests
    )
    return dataclasses.replace(trace, requests=clipped, source=f"{trace.source}; {source.name}")


def write_plan_files(plan: Trace, directory: Path) -> tuple[Path, Path]:
    """The plan as an Azure-format CSV (for ``loadgen replay``; "conv" in the name makes
    its workload ``conversation``) and as guidellm's trace CSV; their paths."""
    azure = directory / "plan-conv.csv"
    guidellm = directory / "plan-guidellm.csv"
    epoch = datetime(2026, 1, 1)
    with azure.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for r in plan.requests:
            stamp = (epoch + timedelta(seconds=r.arrival_s)).strftime("%Y-%m-%d %H:%M:%S.%f")
            writer.writerow([stamp, r.prompt_tokens, r.output_tokens])
    with guidellm.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timestamp", "input_length", "output_length"])
        for r in plan.requests:
            writer.writerow([f"{r.arrival_s:.6f}", r.prompt_tokens, r.output_tokens])
    return azure, guidellm


# -- the stack ---------------------------------------------------------------------------------


class Stack:
    """``switchyard up --embedded`` on ``port`` (health on ``health_port``), its output in
    ``log``."""

    def __init__(self, port: int, health_port: int, log: Path) -> None:
        self.port = port
        self.health_port = health_port
        self.log_path = log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Stack:
        for port in (self.port, self.health_port):
            with socket.socket() as probe:
                probe.settimeout(1.0)
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise BenchError(f"port {port} is in use: stop what listens there first")
        env = {
            **os.environ,
            "SWITCHYARD_HEALTH_PORT": str(self.health_port),
            "SWITCHYARD_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "cli", "up", "--embedded", "--port", str(self.port)]
        self._log = self.log_path.open("w")
        # Its output goes to the log (a pipe nobody reads would fill, or break on close).
        self.process = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 180
        while _URL.search(self.log_path.read_text(errors="replace")) is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise BenchError(
                    f"the stack did not come up: {log_tail(self.log_path)} ({self.log_path})"
                )
            time.sleep(0.2)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __exit__(self, *exc: object) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._log.close()


def warm_up(url: str, model: str) -> None:
    """A few small answers, streamed and not: the stack answers, and its first calls'
    one-off costs are not in a client's figures."""
    body: dict[str, Any] = {"model": model, "prompt": "Hello there", "max_tokens": 8}
    try:
        with httpx.Client(base_url=url, timeout=30.0) as client:
            for index in range(10):
                response = client.post("/v1/completions", json={**body, "stream": index % 2 == 1})
                if response.status_code != 200:
                    raise BenchError(
                        f"the stack at {url} answered {response.status_code} to a warm-up "
                        f"completion: {response.text[:200]}"
                    )
    except httpx.HTTPError as exc:
        raise BenchError(f"the stack at {url} does not answer: {exc!r}") from None


# -- the clients -------------------------------------------------------------------------------


@contextlib.contextmanager
def _measured(stack_pid: int) -> Iterator[dict[str, float | None]]:
    """Wall time, CPU of reaped children (the client) and of the stack, over the block."""
    figures: dict[str, float | None] = {}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    stack_before = cpu_seconds(stack_pid)
    started = time.monotonic()
    yield figures
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stack_after = cpu_seconds(stack_pid)
    figures["wall_s"] = time.monotonic() - started
    figures["client_cpu_s"] = (after.ru_utime + after.ru_stime) - (
        children.ru_utime + children.ru_stime
    )
    figures["stack_cpu_s"] = (
        stack_after - stack_before if stack_after is not None and stack_before is not None else None
    )


def _run_client(
    name: str,
    argv: Sequence[str],
    *,
    stack: Stack,
    output: Path,
    log: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> dict[str, float | None]:
    """``argv`` run to its end, its output in ``log``, measured over the stack (see
    :func:`_measured`); a BenchError unless it exits 0 having written ``output``."""
    output.unlink(missing_ok=True)
    with _measured(stack.pid) as figures, log.open("w") as handle:
        try:
            done = subprocess.run(
                argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"{name} ran past {timeout_s:.0f} s (log: {log})") from None
    if done.returncode != 0 or not output.exists():
        raise BenchError(f"{name} failed (exit {done.returncode}): {log_tail(log)} (log: {log})")
    return figures


def _client_run(
    name: str,
    samples: list[Sample],
    figures: Mapping[str, float | None],
    notes: dict[str, Any],
) -> ClientRun:
    return ClientRun(
        name=name,
        samples=samples,
        wall_s=figures["wall_s"] or 0.0,
        client_cpu_s=figures["client_cpu_s"] or 0.0,
        stack_cpu_s=figures["stack_cpu_s"],
        notes=notes,
    )


def guidellm_scenario(
    *, url: str, model: str, tokenizer: Path, plan_csv: Path, output: Path, request_format: str
) -> dict[str, Any]:
    """guidellm's scenario (``guidellm run -c FILE``): the plan replayed at its timestamps."""
    return {
        "metadata": {"name": "switchyard-trace-replay"},
        "spec": {
            # guidellm first probes GET /health (vLLM's and SGLang's route, its default),
            # which the ingress answers as it does /healthz.
            "backend": {
                "kind": "openai_http",
                "target": url,
                "model": model,
                "request_format": request_format,
            },
            "profile": {"kind": "replay", "schedule_turn": "timestamp"},
            "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
            "data": [
                {
                    "kind": "trace_synthetic",
                    "source": {"kind": "csv_file", "path": str(plan_csv)},
                }
            ],
            "seed": {"kind": "static", "value": 0},
            "outputs": [{"kind": "json", "path": str(output)}],
        },
    }


def run_guidellm(
    venv: Path,
    tokenizer: Path,
    stack: Stack,
    model: str,
    plan_csv: Path,
    directory: Path,
    request_format: str,
    timeout_s: float,
) -> ClientRun:
    """guidellm's own command line on the plan; its per-request figures."""
    output = directory / "guidellm.json"
    scenario = directory / "guidellm-scenario.json"
    log = directory / "guidellm.log"
    scenario.write_text(
        json.dumps(
            guidellm_scenario(
                url=stack.url,
                model=model,
                tokenizer=tokenizer,
                plan_csv=plan_csv,
                output=output,
                request_format=request_format,
            ),
            indent=2,
        )
    )
    argv = [str(venv / "bin" / "guidellm"), "run", "-c", str(scenario), "--disable-progress"]
    figures = _run_client(
        "guidellm",
        argv,
        stack=stack,
        output=output,
        log=log,
        timeout_s=timeout_s,
        env={**os.environ, **OFFLINE_ENV},
    )
    samples, notes = read_guidellm(output)
    return _client_run(
        f"guidellm {GUIDELLM_VERSION}, per request",
        samples,
        figures,
        {**notes, "json": str(output), "log": str(log)},
    )


def run_loadgen(stack: Stack, plan_csv: Path, directory: Path, timeout_s: float) -> ClientRun:
    """``python -m loadgen replay`` on the plan; its per-request records."""
    output = directory / "loadgen.json"
    log = directory / "loadgen.log"
    argv = [
        sys.executable,
        "-m",
        "loadgen",
        "replay",
        "--trace",
        str(plan_csv),
        "--target",
        stack.url,
        "--json",
        str(output),
        "--no-progress",
        "--timeout-s",
        "300",
    ]
    figures = _run_client("loadgen", argv, stack=stack, output=output, log=log, timeout_s=timeout_s)
    samples, notes = read_loadgen(output)
    return _client_run(
        "loadgen replay", samples, figures, {**notes, "json": str(output), "log": str(log)}
    )


# -- the run -----------------------------------------------------------------------------------


def one_run(
    index: int,
    args: argparse.Namespace,
    plan: Trace,
    plan_files: tuple[Path, Path],
    tokenizer: Path,
    directory: Path,
) -> dict[str, Any]:
    """A fresh stack, both clients on it (the order alternates), the stack's records."""
    directory.mkdir(parents=True, exist_ok=True)
    timeout_s = plan.requests[-1].arrival_s + 600
    order = ["guidellm", "loadgen"] if index % 2 == 0 else ["loadgen", "guidellm"]
    runs: dict[str, ClientRun] = {}
    with Stack(args.port, args.health_port, directory / "stack.log") as stack:
        warm_up(stack.url, args.model)
        # What the idle stack spends (heartbeats, the monitor): part of each phase's CPU.
        idle_before = cpu_seconds(stack.pid)
        time.sleep(IDLE_SAMPLE_S)
        idle_after = cpu_seconds(stack.pid)
        idle_cpu_per_s = (
            (idle_after - idle_before) / IDLE_SAMPLE_S
            if idle_after is not None and idle_before is not None
            else None
        )
        for client in order:
            print(f"  run {index + 1}: {client} ...", flush=True)
            if client == "guidellm":
                runs[client] = run_guidellm(
                    args.guidellm_venv,
                    tokenizer,
                    stack,
                    args.model,
                    plan_files[1],
                    directory,
                    args.request_format,
                    timeout_s,
                )
                runs["stack"] = stack_records(
                    stack.url, runs[client], directory / "stack-records.json"
                )
            else:
                runs[client] = run_loadgen(stack, plan_files[0], directory, timeout_s)
            time.sleep(2.0)
    planned = len(plan.requests)
    rows = [
        report_row(runs["guidellm"], planned),
        *(row(runs[name], planned) for name in ("guidellm", "stack", "loadgen")),
    ]
    return {
        "run": index + 1,
        "order": order,
        "stack_idle_cpu_s_per_s": idle_cpu_per_s,
        "rows": rows,
        "guidellm_minus_stack": client_minus_stack(runs["guidellm"], runs["stack"]),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.guidellm_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rate", type=float, default=3.0, help="arrivals per second (3)")
    parser.add_argument("--duration-s", type=float, default=90.0, help="of arrivals (90)")
    parser.add_argument("--runs", type=int, default=2, help="each on a fresh stack (2)")
    parser.add_argument("--seed", type=int, default=0, help="of the plan (0)")
    parser.add_argument("--lengths", default="azure-conv", help="trace lengths are drawn from")
    parser.add_argument("--max-prompt-tokens", type=int, default=7000)
    parser.add_argument("--model", default="llama-2-7b", help="an emulated LLM model")
    parser.add_argument(
        "--request-format",
        default="/v1/completions",
        choices=("/v1/completions", "/v1/chat/completions"),
        help="guidellm's endpoint (loadgen uses /v1/completions)",
    )
    parser.add_argument("--port", type=int, default=18480, help="the stack's API port")
    parser.add_argument("--health-port", type=int, default=18481)
    parser.add_argument("--guidellm-venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    parser.add_argument(
        "--no-install", action="store_true", help="fail rather than install guidellm"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        if args.rate <= 0 or args.duration_s <= 0 or args.runs < 1:
            raise BenchError("--rate and --duration-s must be > 0 and --runs >= 1")
        args.out.mkdir(parents=True, exist_ok=True)
        guidellm = ensure_guidellm(
            args.guidellm_venv, install=not args.no_install, log=args.out / "install.log"
        )
        tokenizer = ensure_tokenizer(args.guidellm_venv, args.tokenizer)
        plan = build_plan(
            args.rate, args.duration_s, args.seed, args.lengths, args.max_prompt_tokens
        )
        plan_files = write_plan_files(plan, args.out)
        prompts = [r.prompt_tokens for r in plan.requests]
        outputs = [r.output_tokens for r in plan.requests]
        print(
            f"guidellm {guidellm['version']} ({guidellm['venv']}), stand-in tokenizer "
            f"{tokenizer['bytes_per_token_held_out']:.2f} bytes/token; plan: "
            f"{len(plan.requests)} requests, Poisson {args.rate:g}/s over "
            f"{plan.requests[-1].arrival_s:.0f} s, prompt tokens mean {statistics.fmean(prompts):.0f}"
            f" (max {max(prompts)}), output tokens mean {statistics.fmean(outputs):.0f} "
            f"(max {max(outputs)}); model {args.model}",
            flush=True,
        )
        runs: list[dict[str, Any]] = []
        for index in range(args.runs):
            run = one_run(
                index, args, plan, plan_files, Path(tokenizer["path"]), args.out / f"run{index + 1}"
            )
            runs.append(run)
            print(
                f"\nrun {run['run']} ({len(plan.requests)} requests planned; order: "
                f"{', then '.join(run['order'])}):"
            )
            print(table(run["rows"]), flush=True)
            print(gap_line(run["guidellm_minus_stack"]), flush=True)
    except (BenchError, SwitchyardError, OSError) as exc:
        print(f"guidellm_bench: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("guidellm_bench: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    medians = median_rows(runs)
    print(f"\nmedians over {len(runs)} runs:")
    print(table(medians))
    path = args.out / "guidellm_bench.json"
    write_document(
        path,
        config={
            "rate_rps": args.rate,
            "duration_s": args.duration_s,
            "requests": len(plan.requests),
            "seed": args.seed,
            "lengths": args.lengths,
            "plan_source": plan.source,
            "max_prompt_tokens": args.max_prompt_tokens,
            "model": args.model,
            "request_format": args.request_format,
            "prompt_tokens_mean": statistics.fmean(prompts),
            "output_tokens_mean": statistics.fmean(outputs),
        },
        guidellm=guidellm,
        tokenizer=tokenizer,
        runs=runs,
        medians=medians,
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
