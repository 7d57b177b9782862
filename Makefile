# Switchyard: `make demo` runs the embedded default, `make test` runs every test tier.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(VENV)/bin
INFRA := deploy/local/infra.sh

.PHONY: help deps demo test test-fast lint format bench infra-up infra-down infra-status clean

help:
	@echo "make demo         replay the bundled trace sample through the embedded stack"
	@echo "make test         install what is missing, start Kafka and Redis, run lint and every test tier"
	@echo "make test-fast    unit and in-memory contract tests (no Kafka or Redis)"
	@echo "make lint         ruff, ruff format --check, mypy --strict"
	@echo "make bench        bus benchmark on the local Kafka broker"
	@echo "make infra-up / infra-down / infra-status"

deps:
	@deploy/local/bootstrap.sh

demo: deps
	@$(BIN)/switchyard demo

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: deps
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Starts Kafka and Redis (or reuses running ones), runs every tier, and always stops
# what it started, passing pytest's exit status on.
test: deps lint
	@start=$$(date +%s); \
	$(INFRA) up || exit 1; \
	trap '$(INFRA) down' EXIT; \
	$(BIN)/pytest; status=$$?; \
	echo "make test: finished in $$(( $$(date +%s) - start )) s (pytest exit status $$status)"; \
	exit $$status

test-fast: deps
	$(BIN)/pytest -m "not integration"

bench: deps
	@$(INFRA) up || exit 1; \
	trap '$(INFRA) down' EXIT; \
	$(BIN)/python -m bench.bus_bench --json bench/results/bus.json

infra-up:
	@$(INFRA) up

infra-down:
	@$(INFRA) down

infra-status:
	@$(INFRA) status

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
