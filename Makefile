# make test     set up .venv (torch CPU build 2.13.0 on CPU machines) and run lint + tests
# make bench    the pytest-benchmark set with statistics, saved under .benchmarks/
# make sweep    set up .venv, time this machine's collectives, then run the DDP bucket sweep on
#               2 ranks; its report holds the cost model's predictions next to the measurements
# GPU machines: install your own CUDA torch into .venv first and pass TORCH= (see README).
PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
NPROC ?= 2
SWEEP ?= bucket_cap_mb
ARGS ?=
BIN := $(VENV)/bin
# The collectives the cost model prices DDP and FSDP with, timed before the sweep.
COLLECTIVES_RUN ?= results/$(shell date -u +%Y%m%dT%H%M%SZ)-collectives

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH) -e '.[test]'
	touch $@

.PHONY: setup browser test bench sweep tensorboard
setup: $(BIN)/.installed browser

# Headless Chromium for the report's browser test (Debian's package; needs apt-get as root).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends chromium >/dev/null; } || \
	echo "Chromium could not be installed: the report's browser test will be skipped"

# Benchmarks run once each here (--benchmark-disable) and the reference/native gate measures
# for real; `make bench` gives the benchmarks their rounds and statistics.
test: $(BIN)/.installed browser
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest --benchmark-disable

# make bench ARGS="--benchmark-compare --benchmark-compare-fail=median:15%"
bench: $(BIN)/.installed
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/benchmarks --benchmark-autosave $(ARGS)

sweep: $(BIN)/.installed
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) bench/run.py \
	  --sweep message_size --collectives all_reduce,all_gather,reduce_scatter -b 4K -e 64M -f 4 \
	  --out $(COLLECTIVES_RUN) --no-report
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) bench/run.py \
	  --sweep $(SWEEP) --predict-with $(COLLECTIVES_RUN) $(ARGS)

# make tensorboard RUN=results/<run>
tensorboard: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[tensorboard]'
	$(BIN)/tensorboard --logdir $(RUN)/traces --host 127.0.0.1
