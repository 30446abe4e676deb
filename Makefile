# Primus-SaFE: `make run` (the demo on the embedded stack) and `make test`.
# Both create .venv and install the project on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

include deploy/tools.mk

.PHONY: help install run up test test-fast lint proto bench clean

help:
	@echo "make run      install if needed, then run the demo (onboard, train, kill a node, recover)"
	@echo "make test     install if needed, then run every test (real NATS, real ClickHouse engine)"
	@echo "make up       the embedded stack in the foreground"
	@echo "make lint     ruff"
	@echo "make proto    regenerate proto/, the chart's NATS users and the README route tables"
	@echo "make bench    run the benchmarks in bench/"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/primus-safe demo

up: $(STAMP)
	$(VENV)/bin/primus-safe up

test: $(STAMP) helm
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not e2e"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

proto: $(STAMP)
	$(PY) -m cli.catalog --write

bench: $(STAMP)
	$(PY) bench/bus_latency.py

clean:
	rm -rf .primus .pytest_cache .ruff_cache
