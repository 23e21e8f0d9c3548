# The two commands of README.md:
#   make demo   install, then train standard on the built-in corpus (seeds 42 and 1337), show status and report
#   make test   install, then lint and run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SEEDS ?= 42 1337

# Offline machines can point tiktoken at a cache folder; the project's CI keeps one in ../shared.
ifeq ($(origin TIKTOKEN_CACHE_DIR),undefined)
ifneq ($(wildcard ../shared/tiktoken/.),)
export TIKTOKEN_CACHE_DIR := $(abspath ../shared/tiktoken)
endif
endif

.PHONY: install demo test lint clean

$(BIN)/attnres: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0   # the CPU wheel; an unpinned torch pulls CUDA
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/attnres

demo: install
	$(BIN)/attnres launch standard --seeds $(SEEDS) --preset tiny
	$(BIN)/attnres status
	$(BIN)/attnres report --out attnres-results.md
	@echo "report written to attnres-results.md"

lint: install
	$(BIN)/ruff check .

test: install lint
	$(BIN)/python -m pytest -q --durations=15

clean:
	rm -rf $(VENV) runs.db runs.db-* data logs checkpoints reports/*.png attnres-results.md
