# The two commands: `make run` (the local estate) and `make test` (the whole suite).
# Each installs what is missing first, so that on a fresh machine they are the only set-up.
PYTHON ?= python3.11
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := $(shell command -v $(PYTHON) || command -v python3)
UV := $(shell command -v uv 2>/dev/null)

.PHONY: setup run test lint bench proto

setup:
ifeq ($(UV),)
	$(PYTHON) -m pip install --quiet uv
endif
	uv sync --all-packages --frozen

run: setup
	uv run --frozen stoa-estate run

test: setup
	uv run --frozen ruff check .
	uv run --frozen pytest

lint: setup
	uv run --frozen ruff check .
	uv run --frozen ruff format --check .

proto: setup
	uv run --frozen python proto/generate.py
