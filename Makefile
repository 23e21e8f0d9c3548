# The two commands of README.md:
#   make demo   install, then train standard and one AttnRes variant on the built-in corpus (seeds 42 and 1337),
#               show status and write the report with every section filled
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

.PHONY: install demo test lint clean gpu-check

$(BIN)/attnres: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0   # the CPU wheel; an unpinned torch pulls CUDA
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/attnres

DEMO_VARIANTS ?= standard block_hybrid_memory
# 6 layers (blocks of 3): deep enough that the depth-attention maps have long skips to name; 4 sequences
# a step, as the GPT-2 vocabulary's output layer dominates a tiny model's step on a CPU (~4 min on 2 cores)
DEMO_SETTINGS ?= --preset tiny --set n_layer=6 --set batch_size=4 --set eval_batches=4 --steps 150

demo: install
	$(BIN)/attnres launch $(DEMO_VARIANTS) --seeds $(SEEDS) $(DEMO_SETTINGS)
	$(BIN)/attnres status
	$(BIN)/attnres report --out attnres-results.md
	@echo "report written to attnres-results.md"

lint: install
	$(BIN)/ruff check .

# Two test processes: most of a test's time is a run's processes starting (one core each) and polls,
# so two tests at once use both cores; SLURM's tests share one worker (its one node).
TEST_WORKERS ?= 2

# the test extra: Triton, whose interpreter runs the GPU kernel's tests on CPU (3.9.0 is the version beside
# torch 2.13; a CUDA build of torch brings its own), and the three mirrors' packages (their tests write to
# real local stores, offline); the tool itself needs none of them
$(VENV)/.test-extra: $(BIN)/attnres pyproject.toml
	$(BIN)/python -m pip install -q triton==3.9.0 -e ".[test]"
	touch $@

test: install lint $(VENV)/.test-extra
	$(BIN)/python -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadgroup

# The GPU check, on a machine with a CUDA build of torch and Triton (GPU_PYTHON: that environment's python,
# with this checkout installed): the Triton kernel compiled for the GPU against the float64 reference
# (forward and every gradient), then every variant with a target raced against standard at a paper-like
# shape (paper500m: 24 layers, d 1536; 8 x 1024 tokens a step; bf16): tokens/s ratios, CUDA peak memory
# above weights and optimizer, saved-activation bytes, and the depth kernel's path.
# `make gpu-check GPU_DEVICE=cpu` rehearses the same two steps on this machine: the kernel in Triton's
# interpreter, and the bench at the tiny preset, two steps (what the GPU run does, at a CPU's size).
GPU_PYTHON ?= python3
GPU_DEVICE ?= cuda
ifeq ($(GPU_DEVICE),cuda)
GPU_ENV := TRITON_INTERPRET=0
GPU_BENCH := --preset paper500m --set batch_size=8 --steps 10
else
GPU_ENV := TRITON_INTERPRET=1 ATTNRES_TRITON_KERNEL=1
GPU_BENCH := --preset tiny --set batch_size=2 --steps 2 control_block block_hybrid_memory
endif
gpu-check:
	$(GPU_ENV) ATTNRES_TEST_DEVICE=$(GPU_DEVICE) $(GPU_PYTHON) -m pytest -q -p no:cacheprovider \
		tests/test_equivalence.py -k "triton and not compile"
	$(GPU_ENV) $(GPU_PYTHON) -m attnres.cli.main bench --device $(GPU_DEVICE) $(GPU_BENCH)

clean:
	rm -rf $(VENV) runs.db runs.db-* data logs checkpoints reports/*.png attnres-results.md attnres-results_figures
