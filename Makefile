# Two commands do all set-up on a fresh machine:
#   make demo    set up .venv, then train central + 2 workers on digits over the embedded broker
#   make test    set up .venv, then lint, type-check and run every test tier
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: demo test lint unit bench pi-lab systemd-lab clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	# The CPU build first: any other torch requirement would pull several GB of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/edgeagent demo $(ARGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check edgeagent tests bench
	$(BIN)/mypy

# Three processes share the tests (pytest-xdist) on 2 cores: they wait on brokers and timers much of the
# time (two left a core idle: 8:48-9:51 for this part, three 7:58). Those marked serial measure speed and
# run alone afterwards. Exit code 5 is "no test selected" (ARGS picked only one kind). mypy (40 s of one
# core) runs beside the shared tests, not beside the serial ones; its report follows theirs and fails the
# target as lint would.
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider --durations=10
test: $(BIN)/.installed
	$(BIN)/ruff check edgeagent tests bench
	$(BIN)/mypy > .mypy.out 2>&1 & mypy=$$!; \
	$(PYTEST) -n 3 --dist worksteal -m "not serial" $(ARGS) || [ $$? -eq 5 ] || failed=1; \
	wait $$mypy || failed=1; cat .mypy.out; rm -f .mypy.out; [ -z "$$failed" ]
	$(PYTEST) -m serial $(ARGS) || [ $$? -eq 5 ]

unit: $(BIN)/.installed
	$(BIN)/python -m pytest -q tests/unit

bench: $(BIN)/.installed
	$(BIN)/python bench/transport.py
	$(BIN)/python bench/pipeline.py

# A Pi lab on this machine (root: network namespaces, tc, cgroup v1 CPU quotas); see docs/pi_lab.md.
#   sudo make pi-lab [ARGS="--cpu 25,35,50 --mbps 20 --no-restart ..."]
pi-lab: $(BIN)/.installed
	$(BIN)/python bench/pi_lab.py $(ARGS)

# The shipped units under a real systemd (a Debian container, systemd as PID 1; root): install, start,
# SIGKILL the central node, restart a worker, stop; see docs/deployment.md.
#   sudo make systemd-lab [ARGS="--epochs 6 --keep"]
systemd-lab: $(BIN)/.installed
	$(BIN)/python bench/systemd_lab.py $(ARGS)

clean:
	rm -rf $(VENV)
