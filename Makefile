# make test     set up .venv (torch CPU build 2.13.0 on CPU machines) and run lint + tests
# make sweep    set up .venv and run the DDP bucket sweep on 2 ranks, with its report
# GPU machines: install your own CUDA torch into .venv first and pass TORCH= (see README).
PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
NPROC ?= 2
SWEEP ?= bucket_cap_mb
ARGS ?=
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH) -e '.[test]'
	touch $@

.PHONY: setup test sweep tensorboard
setup: $(BIN)/.installed

test: $(BIN)/.installed
	$(BIN)/ruff check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest

sweep: $(BIN)/.installed
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) bench/run.py --sweep $(SWEEP) $(ARGS)

# make tensorboard RUN=results/<run>
tensorboard: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[tensorboard]'
	$(BIN)/tensorboard --logdir $(RUN)/traces --host 127.0.0.1
