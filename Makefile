# The two commands of the README: `make run` (set up, then the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORKDIR ?= runs/main

.PHONY: setup system-deps container-deps run test lint bench

# System packages: bubblewrap isolates the agent sandboxes (c2/envs/sandbox.py).
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "note: bubblewrap missing and cannot be installed here; sandboxes use a weaker fallback"; fi; }

# The container backend (c2/envs/container.py; not needed otherwise): podman with the runc runtime,
# and mmdebstrap for local base images where no registry is reachable.
container-deps:
	@command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 \
	  && command -v mmdebstrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      podman runc mmdebstrap >/dev/null; \
	  else echo "note: podman, runc or mmdebstrap missing and cannot be installed here"; exit 1; fi; }

$(BIN)/python:
	$(PY) -m venv $(VENV)

# constraints.txt pins torch's CPU build (2.13.0+cpu), which only a CPU wheel source serves: the
# PyTorch CPU index (TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu) or local wheels. When
# pip cannot find it, the same version's default build (torch==2.13.0, public index) is pinned.
TORCH_INDEX_URL ?=
TORCH_PIN := torch==2.13.0+cpu
PIP_EXTRA := $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL))

setup: $(BIN)/python system-deps
	$(BIN)/pip install -q --upgrade pip
	@if $(BIN)/pip install -q --dry-run --no-deps --ignore-installed $(PIP_EXTRA) '$(TORCH_PIN)' \
	    >/dev/null 2>&1; then cons=constraints.txt; \
	else \
	  echo "note: $(TORCH_PIN) not found; pinning torch==2.13.0 (set TORCH_INDEX_URL for the CPU build)"; \
	  cons=$$(mktemp); \
	  sed 's/^$(TORCH_PIN)$$/torch==2.13.0/' constraints.txt > $$cons; \
	fi; \
	echo "$(BIN)/pip install -q -c $$cons $(PIP_EXTRA) -e '.[test,distributed]'"; \
	$(BIN)/pip install -q -c $$cons $(PIP_EXTRA) -e '.[test,distributed]'

run: setup
	$(BIN)/python -m c2.main --config=experiments/pipeline_tiny.py --workdir=$(WORKDIR)

lint:
	$(BIN)/ruff check .

# worksteal: a worker that runs dry takes the back half of the other's queue; tests/conftest.py
# starts the modules slowest in tests/durations.txt first, so the run ends on short tests.
test: setup lint
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=50

bench: setup
	$(BIN)/python -m c2.bench.model_throughput
