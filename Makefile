# Switchyard: `make demo` runs the embedded default, `make test` runs every test tier.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(VENV)/bin
INFRA := deploy/local/infra.sh
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-x -k bus"`.
PYTEST_ARGS ?=

.PHONY: help deps native demo demo-bus simulate-demo test test-fast lint format bench bench-sim bench-eval bench-capacity bench-chunked bench-disaggregation bench-paper-regime bench-estimator bench-selection bench-selection-eval bench-multimodel bench-stack bench-recovery bench-agreement bench-pipeline-agreement bench-pipeline-admission bench-guidellm dashboard-snapshot bench-worker-stream bench-bus-overhead bench-embedded bench-memory faults infra-up infra-down infra-status clean compose-test

help:
	@echo "make deps         install what is missing: redis-server, .venv, the Kafka jars"
	@echo "make native       compile the hot modules (simulator, GAPS, the window search) with mypyc; test, test-fast, simulate-demo and the benchmarks that run them do"
	@echo "make demo         start the embedded stack and replay the bundled trace through its HTTP API"
	@echo "make simulate-demo compare every LLM scheduling policy on the bundled trace in the simulator"
	@echo "make demo-bus     replay the bundled sample through the embedded bus and state store"
	@echo "make test         deps, lint, start Kafka, Redis and Docker, run every test tier (containers too)"
	@echo "make test-fast    unit and in-memory contract tests (no Kafka or Redis)"
	@echo "make lint         ruff check, ruff format --check, mypy --strict"
	@echo "make bench        bus benchmark on the local Kafka broker"
	@echo "make bench-sim    simulator speed and policy decision speed"
	@echo "make bench-eval   the GAPS evaluation grid (both Azure traces, 4-32 workers, 3 seeds)"
	@echo "make bench-capacity  every LLM policy's capacity at 90/99 % SLO attainment (Azure, Mooncake; 8-32 workers), then P99 TTFT at the best baseline's capacity and each trace's compute ceiling"
	@echo "make bench-chunked   chunked prefill as a simulator option: capacity, TTFT and TPOT with and without"
	@echo "make bench-disaggregation  prefill/decode disaggregation as a simulator option: capacity, TTFT and TPOT"
	@echo "make bench-guidellm  guidellm (vLLM's benchmark client) against the stack, beside the load generator"
	@echo "make dashboard-snapshot  the README's picture of the dashboard, drawn from a live stack's Prometheus"
	@echo "make bench-paper-regime  the GAPS paper's regime: every policy, the paper's claims side by side"
	@echo "make bench-estimator  SneakPeek estimation time per 24-request batch (flat, IVF, HNSW)"
	@echo "make bench-selection  window scheduler overhead (24 requests, 5 applications)"
	@echo "make bench-selection-eval  the classification tables: variants, window scheduling, accuracy"
	@echo "make bench-multimodel  the multi-model tables: policies, LoRA mix, update frequency, decision time"
	@echo "make bench-stack  the live stack on Kafka and Redis: CPU per request, overhead by rate, fan-out, Azure replay"
	@echo "make bench-recovery  worker-kill recovery (services as processes): detection, re-assignment, lost/doubled"
	@echo "make bench-agreement  sim-to-live agreement: 2,000 rows of each Azure trace, live stack against the simulator"
	@echo "make bench-pipeline-agreement  sim-to-live agreement for pipelines: the LoRA sample's calls, embedded stack against the multi-model simulator"
	@echo "make bench-pipeline-admission  pipeline calls at multiples of capacity, admission control on and off: goodput and latency"
	@echo "make bench-worker-stream  an emulated worker on Kafka: wall against modelled time, streamed and not"
	@echo "make bench-bus-overhead  the bus's Python cost a message (memory transport), with and without per-message spans"
	@echo "make bench-embedded  the embedded default under the demo's load: CPU per request, control plane by kind"
	@echo "make faults       the fault matrix: every fault kind during a 10,000-request replay (processes, own Kafka and Redis)"
	@echo "make infra-up / infra-down / infra-status"
	@echo "make compose-test  Docker engine, compose and images (built or cached), then docker-compose.yml tested in containers"
	@echo "make clean        remove .venv and caches inside the repository"

deps:
	@deploy/local/bootstrap.sh

native: deps
	@$(BIN)/python -m research.native build

# The embedded stack (every service in one process, in-memory bus and state) and 1,200
# requests of the bundled Azure samples, 30 % of them turned into classification
# requests, replayed through its HTTP API once per policy (GAPS, then JSQ): under a minute.
demo: deps
	$(BIN)/switchyard demo

demo-bus: deps
	$(BIN)/switchyard demo-bus

simulate-demo: deps native
	$(BIN)/switchyard simulate --trace azure-mix-sample --workers 4 --load-scale 1.5

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_layers.py

format: deps
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Starts Kafka and Redis (or reuses running ones) and a Docker engine with compose and the
# base images (deploy/local/docker.sh), runs every tier (tests/containers included), and
# always stops the Kafka and Redis this very run started (not servers that were already
# up; the Docker engine stays, as a system service would: `deploy/local/docker.sh stop`),
# even when tests fail or make is interrupted; exits with pytest's status. pytest runs in the background and is waited
# for, so that a SIGTERM sent to make reaches the cleanup at once.
test: deps native lint
	@start=$$(date +%s); started=$$(mktemp); status=1; \
	finish() { \
	  $(INFRA) down --started "$$started" || true; rm -f "$$started"; \
	  echo "make test: exit status $$status after $$(( $$(date +%s) - start )) s"; \
	}; \
	trap finish EXIT; trap 'status=143; kill -TERM $$pid 2>/dev/null; exit 143' INT TERM; pid=; \
	$(INFRA) up --record "$$started" || exit 1; \
	deploy/local/docker.sh || exit 1; \
	echo "SWITCHYARD_CONTAINER_TESTS=1 $(BIN)/pytest $(PYTEST_ARGS)"; \
	SWITCHYARD_CONTAINER_TESTS=1 $(BIN)/pytest $(PYTEST_ARGS) </dev/null & pid=$$!; \
	wait $$pid && status=0 || status=$$?; \
	exit $$status

test-fast: deps native
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

# $(call with_infra,COMMANDS): COMMANDS with Kafka and Redis up, then stops what this run
# started (not servers that were already up), even when a command fails.
with_infra = @started=$$(mktemp); \
	trap '$(INFRA) down --started "$$started" || true; rm -f "$$started"' EXIT; \
	trap 'exit 130' INT TERM; \
	$(INFRA) up --record "$$started" || exit 1; \
	$(1)

bench: deps
	$(call with_infra,$(BIN)/python -m bench.bus_bench --json bench/results/bus.json)

bench-sim: deps native
	$(BIN)/python -m bench.sim_bench --json bench/results/sim.json

bench-eval: deps native
	$(BIN)/python -m bench.gaps_eval --json bench/results/gaps_eval.json

bench-capacity: deps native
	$(BIN)/python -m bench.capacity_eval --with-admission ttft-feasible --json bench/results/capacity_eval.json
	$(BIN)/python -m bench.ttft_at_capacity
	$(BIN)/python -m bench.goodput_ceiling

bench-estimator: deps
	$(BIN)/python -m bench.estimator_bench --json bench/results/estimator.json

bench-selection: deps native
	$(BIN)/python -m bench.selection_bench

bench-selection-eval: deps native
	$(BIN)/python -m bench.selection_eval

bench-multimodel: deps native
	$(BIN)/python -m bench.multimodel_eval
	$(BIN)/python -m bench.multimodel_policy_bench

# The GAPS paper's regime (one request at a time per worker, 85 % load) and the
# continuous-batching one, every LLM policy, the paper's claims side by side; about 6
# minutes. Figures in docs/benchmarks.md, "The GAPS paper's regime".
bench-paper-regime: deps native
	$(BIN)/python -m bench.paper_regime

# Chunked prefill as a simulator option: capacity, TTFT and TPOT of switchyard and jsq on
# the Azure code and Mooncake traces with it off and at 512 and 2,048 tokens, and the
# simulator's speed with it; under a minute. Figures in docs/benchmarks.md, "Capacity".
bench-chunked: deps native
	$(BIN)/python -m bench.chunked_prefill_eval --json bench/results/chunked_prefill_eval.json

# Prefill/decode disaggregation as a simulator option: capacity, TTFT and TPOT of
# switchyard, jsq and splitwise with the pools off and split 4, 6 and 8 of 16 on the
# Azure and Mooncake traces; about 3 minutes. Figures in docs/benchmarks.md, "Capacity".
bench-disaggregation: deps native
	$(BIN)/python -m bench.disaggregation_eval --json bench/results/disaggregation_eval.json

# The live stack on the local Kafka and Redis: CPU per request by process, overhead and
# the sustained rate (services as processes, with flame graphs at 200/s); records decoded
# per request as workers and ingress replicas are added; an unloaded request's time hop
# by hop; the Azure conversation trace under GAPS and JSQ. Figures in docs/benchmarks.md.
bench-stack: deps
	$(call with_infra,$(BIN)/python -m bench.hot_path_bench rates --profile-rate 200 \
	  && $(BIN)/python -m bench.hot_path_bench fanout \
	  && $(BIN)/python -m bench.latency_anatomy \
	  && $(BIN)/python -m bench.stack_bench azure)

# The bus's own cost a message, apart from any broker: publish and consume on the memory
# transport with and without per-message spans, and each piece alone. Figures in
# docs/benchmarks.md, "The hot path".
bench-bus-overhead: deps
	$(BIN)/python -m bench.bus_overhead_bench

# The embedded default (every service in one process, in memory) under make demo's load:
# CPU per request and the control plane's latency by kind, in and out of the trace's
# burst. Figures in docs/benchmarks.md, "The embedded default".
bench-embedded: deps
	$(BIN)/python -m bench.embedded_bench

# The embedded stack's resident memory and state keys over a 20,000-request replay, with
# and without a key bound. Figures in docs/benchmarks.md, "Memory of the embedded stack".
bench-memory: deps
	$(BIN)/python -m bench.memory_bench

# The fault matrix: each fault kind (kills of every service, a frozen, a cut-off and a
# slow worker, broker and Redis restarts) during a 10,000-request replay, on service
# processes over a Kafka and a Redis of its own; about 35 minutes. Table and JSON in
# bench/results/faults/; figures in docs/reliability.md. Needs root for the network cut.
faults: deps
	$(BIN)/python -m bench.fault_matrix --out bench/results/faults

# Worker-kill recovery: the stack as separate processes on the local Kafka and Redis, a
# worker SIGKILLed mid-replay, three runs; JSON in bench/results/recovery/.
bench-recovery: deps
	$(call with_infra,$(BIN)/python -m bench.recovery_bench --runs 3 --out bench/results/recovery)

# Sim-to-live agreement: 2,000 rows of each Azure trace under GAPS and JSQ, through the
# live stack (services as processes) and the simulator; about 40 minutes.
bench-agreement: deps native
	$(call with_infra,$(BIN)/python -m bench.agreement_bench \
	  && $(BIN)/python -m bench.agreement_bench --sensitivity)

# Sim-to-live agreement for pipelines: 200 calls of the Alibaba LoRA sample through the
# embedded stack (emulated-models workers, in memory) at two time scales and through the
# multi-model simulator; a few minutes. Table on stdout, JSON in
# bench/results/pipeline_agreement/.
bench-pipeline-agreement: deps
	$(BIN)/python -m bench.pipeline_agreement --time-scale 50,25 --placement-update-hz 5,2.5

# txt2img-hd calls at 0.5 to 4 times the cluster's capacity through the embedded stack,
# admission control off and on (the same arrivals): goodput and latency; a few minutes.
# Table on stdout, JSON in bench/results/pipeline_admission/.
bench-pipeline-admission: deps
	$(BIN)/python -m bench.pipeline_admission

# A third-party benchmark client: guidellm 0.8.1 (in a cached virtual environment of its
# own, about 6 GB) and the load generator replay one Poisson plan against the embedded
# stack; their figures and the stack's own, compared; about 10 minutes. Figures in
# docs/benchmarks.md, "A third-party benchmark client".
bench-guidellm: deps
	$(BIN)/python -m bench.guidellm_bench

# The README's picture of the dashboard: every panel's query on a live stack's Prometheus.
dashboard-snapshot: deps
	$(call with_infra,$(BIN)/python -m bench.dashboard_snapshot)

# An emulated worker on the local Kafka: wall against modelled time of a burst of
# requests, streamed and not (does publishing the answers keep up with the model?).
bench-worker-stream: deps
	$(call with_infra,$(BIN)/python -m bench.worker_stream_bench)

# The compose file in real containers: deploy/local/docker.sh starts an engine when none
# runs, installs compose v2 and the base images (stand-ins only where a pull fails), then
# tests/containers builds the project's images and drives the whole stack, and removes it.
compose-test: deps
	deploy/local/docker.sh
	SWITCHYARD_CONTAINER_TESTS=1 $(BIN)/pytest tests/containers $(PYTEST_ARGS)

infra-up:
	@$(INFRA) up

infra-down:
	@$(INFRA) down

infra-status:
	@$(INFRA) status

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -prune -exec rm -rf {} +
