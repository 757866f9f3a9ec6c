# make test     set up .venv (torch CPU build 2.13.0 on CPU machines) and run lint + tests
# make test-fast  lint and the unit tier only (the inner loop)
# make bench    the pytest-benchmark set with statistics, saved under .benchmarks/
# make sweep    set up .venv, time this machine's collectives, then run the DDP bucket sweep on
#               2 ranks; its report holds the cost model's predictions next to the measurements
# make gpu-check  the GPU path on a CUDA machine, a few minutes (says so and exits 0 without)
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
	$(BIN)/pip install -q --no-compile $(TORCH) -e '.[test]'
	@# pip compiles the installed files to bytecode one at a time (40 of its 80 s here);
	@# compileall does it on every core (10 s), less the packages' own test suites (pandas',
	@# sympy's, scipy's: a fifth of the source, never imported here). A few of torch's test
	@# files are Python 3.12 syntax that neither can compile: pip skips them, and so does this.
	$(BIN)/python -m compileall -q -j 0 -x '/tests/' "$$($(BIN)/python -c 'import sysconfig; \
	  print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	touch $@

.PHONY: setup system bytecode test test-fast bench sweep tensorboard gpu-check
setup: $(BIN)/.installed system

# What tests need from the system, Debian's packages installed only where missing (apt-get, as
# root): headless Chromium for the report's and TensorBoard's browser tests, iproute2 (`ip
# netns`) for the two-node test, munge and SLURM's daemons and client for the test under a real
# SLURM. Where they cannot be installed those tests skip, saying so; under CI=true (.ci/run)
# that skip is a failure (tests/conftest.py). Accelerate comes with the test extra.
system:
	@missing=; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  missing="$$missing chromium"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v munged >/dev/null || [ -x /usr/sbin/munged ] || missing="$$missing munge"; \
	[ -x /usr/sbin/slurmctld ] || missing="$$missing slurmctld"; \
	[ -x /usr/sbin/slurmd ] || missing="$$missing slurmd"; \
	command -v sbatch >/dev/null || missing="$$missing slurm-client"; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends $$missing >/dev/null; } || \
	echo "could not install$$missing (apt-get as root): tests that need it skip (fail if CI=true)"

# Benchmarks run once each here (--benchmark-disable) and the reference/native gate measures
# for real; `make bench` gives the benchmarks their rounds and statistics. The suite is bound by
# the CPU (about 1,700 CPU-seconds here) and a serial run leaves a third of 2 cores idle while
# tests wait on signals, time limits and launches, so TEST_WORKERS pytest-xdist workers share it,
# a file to a worker (its module fixtures launch once). Three were no faster than two (the CPU
# is the bound: docs/benchmarks.md, "make test's time"). The tests marked serial (timing that
# reads the scheduler) run after, alone, collected from their files only (collecting every file
# took 10 of that pass's 36 s; tests/conftest.py refuses a serial test in a file that does not
# say `pytest.mark.serial`, which this list would miss). TEST_WORKERS=0 runs everything in one
# process.
TEST_WORKERS ?= 2
SERIAL_FILES = $(shell grep -rlF 'pytest.mark.serial' tests --include='test_*.py')
test: $(BIN)/.installed system bytecode
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest --benchmark-disable -n $(TEST_WORKERS) \
	  --dist loadfile -m "not serial"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest --benchmark-disable -m serial $(SERIAL_FILES)

# The project's own modules compiled once, not in every process the tests start: where
# PYTHONDONTWRITEBYTECODE is set no process caches them, and each rank, launcher and command
# compiled its 100-odd modules again (0.15 CPU-s a process: docs/benchmarks.md, "make test's
# time"). A module edited since is compiled again by the process that imports it.
bytecode: $(BIN)/.installed
	$(BIN)/python -m compileall -q -j 0 bench parallel_kernels examples tests >/dev/null

# The unit tier alone (tests/conftest.py's tiers): the inner loop, a few minutes.
test-fast: $(BIN)/.installed bytecode
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest --benchmark-disable -m unit

# make bench ARGS="--benchmark-compare --benchmark-compare-fail=median:15%"
bench: $(BIN)/.installed
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/benchmarks --benchmark-autosave $(ARGS)

sweep: $(BIN)/.installed
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) bench/run.py \
	  --sweep message_size --collectives all_reduce,all_gather,reduce_scatter -b 4K -e 64M -f 4 \
	  --out $(COLLECTIVES_RUN) --no-report
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) bench/run.py \
	  --sweep $(SWEEP) --predict-with $(COLLECTIVES_RUN) $(ARGS)

# make tensorboard RUN=results/<run>. Offline, the scalars dashboard (run sweep_scalars) and the
# profiler plugin's run, view and worker lists work; the plugin's views load Google Charts from
# www.gstatic.com and spin without internet (docs/tensorboard.md).
tensorboard: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[tensorboard]'
	@echo "Without internet: the scalars dashboard (run sweep_scalars) works, and so do the"
	@echo "PyTorch Profiler tab's run, view and worker lists. Its views (Overview, Operator, Trace,"
	@echo "Distributed, Memory) load Google Charts from www.gstatic.com and spin forever."
	@echo "To see a trace offline: docs/tensorboard.md."
	$(BIN)/tensorboard --logdir $(RUN)/traces --host 127.0.0.1

# The GPU path checked by hand on a CUDA machine (scripts/gpu_check.sh; CI has no GPU): on a GPU
# machine install your CUDA torch first and run `make gpu-check TORCH=`.
gpu-check: $(BIN)/.installed
	PY=$(BIN)/python bash scripts/gpu_check.sh
