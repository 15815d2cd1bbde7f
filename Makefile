# The two commands of the README: `make run` (set up, then the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORKDIR ?= runs/main

.PHONY: setup system-deps run test lint bench

# System packages: bubblewrap isolates the agent sandboxes (c2/envs/sandbox.py).
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "note: bubblewrap missing and cannot be installed here; sandboxes use a weaker fallback"; fi; }

$(BIN)/python:
	$(PY) -m venv $(VENV)

setup: $(BIN)/python system-deps
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'

run: setup
	$(BIN)/python -m c2.main --config=experiments/pipeline_tiny.py --workdir=$(WORKDIR)

lint:
	$(BIN)/ruff check .

test: setup lint
	$(BIN)/python -m pytest -n 2 --durations=25

bench: setup
	$(BIN)/python -m c2.bench.model_throughput
