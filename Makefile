# The two commands: `make run` (the local estate) and `make test` (the whole suite).
# Each installs what is missing first, so that on a fresh machine they are the only set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := 3.11
# uv through the interpreter's own module, so a fresh pip install is usable without a PATH change.
UV := $(PYTHON) -m uv

.PHONY: setup run test lint bench proto

# Debian's Chromium and its driver for the console's browser tests (part of `make test`): installed
# here when missing, so the tests never skip for want of a browser and nothing downloads one.
setup:
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet uv
	$(UV) sync --all-packages --frozen
	@# The MCP conformance suite and the Node 22 it needs, from the npm registry (package-lock.json).
	@test -x conformance/node_modules/.bin/conformance || npm ci --prefix conformance --no-audit --no-fund
ifeq ($(and $(shell command -v chromium 2>/dev/null),$(shell command -v chromedriver 2>/dev/null)),)
	apt-get update -qq && apt-get install -y -qq chromium chromium-driver
endif

run: setup
	$(UV) run --frozen stoa-estate run

test: setup
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .
	$(UV) run --frozen pytest

lint: setup
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .

# Benchmarks: not part of `make test`. Installs wrk (Debian) when missing; BENCH_QUICK=1
# runs every scenario with fewer repetitions and shorter load phases (under 5 minutes).
bench: setup
ifeq ($(shell command -v wrk 2>/dev/null),)
	apt-get update -qq && apt-get install -y -qq wrk
endif
	$(UV) run --frozen python -m stoa_harness.bench

proto: setup
	$(UV) run --frozen python proto/generate.py
