# Sluice: `make run` serves a local demo, `make test` runs the suite, `make lint` checks style
# and types, `make fuzz` fuzzes a live local Sluice (docs/fuzzing.md). Every target first makes
# sure .venv exists and holds the pinned requirements.

# Everything started from this Makefile is a local run: without SECRET_KEY it uses a random
# key generated for this checkout under var/ (settings refuse to start otherwise).
export SLUICE_LOCAL_SECRET ?= 1

VENV := .venv
PY := $(VENV)/bin/python
# Python 3.11 if the machine has it, else whatever python3 is (checked below).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# The install stamp is named after the requirements' content, so editing a pin (or pulling
# one) reinstalls, while a fresh checkout's new file times alone do not.
REQ_FILES := requirements.txt requirements-dev.txt client/pyproject.toml protocol/pyproject.toml
REQ_HASH := $(shell cat $(REQ_FILES) | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(REQ_HASH)

.PHONY: run test test-unit lint bench fuzz soak venv image

venv: $(STAMP)

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Sluice needs Python 3.11 or newer; run: make PYTHON=/path/to/python3.11 ..." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): | $(PY)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

run: venv
	$(PY) -m scripts.dev

# The suite needs a real Postgres and Redis; these are the local default ports. It runs in
# TEST_PROCESSES pytest processes (pytest-xdist, one module per process at a time): the e2e
# tests mostly wait on their servers, so three keep a 2-core machine busy without crowding it.
# Each process has its own test database and Redis namespace (tests/conftest.py).
# TEST_PROCESSES=0 runs the suite in this one process.
TEST_PROCESSES ?= 3
test: venv
	DATABASE_URL="$${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}" \
	REDIS_URL="$${REDIS_URL:-redis://127.0.0.1:6379/0}" \
	$(VENV)/bin/pytest -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)

# The unit tier: every test that starts no uvicorn and no runworker (docs/architecture.md).
test-unit: venv
	$(MAKE) test PYTEST_ARGS='-m "not e2e" $(PYTEST_ARGS)'

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy config api workspaces admission dashboard tests scripts client protocol
	$(VENV)/bin/lint-imports

bench: venv
	@if [ -f benchmarks/run.py ]; then \
		$(PY) benchmarks/run.py; \
	else \
		echo "make bench: benchmarks/run.py does not exist yet, so there is nothing to run." >&2; \
		exit 1; \
	fi

# A live API and worker on a throwaway database (sluice_fuzz), the same Postgres and Redis as
# `make test`. FUZZ_ARGS passes options on, e.g. FUZZ_ARGS="--seed 7 --examples 300".
fuzz: venv
	DATABASE_URL="$${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}" \
	REDIS_URL="$${REDIS_URL:-redis://127.0.0.1:6379/0}" \
	$(PY) -m fuzz.run $(FUZZ_ARGS)

# A bounded soak (docs/soak.md): SOAK_SECONDS=60 for a quick check, 600 by default; then the
# contract 2.8 burst at 2,000 calls, failing on its speed-independent bounds (docs/benchmarks.md).
soak: venv
	DATABASE_URL="$${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}" \
	REDIS_URL="$${REDIS_URL:-redis://127.0.0.1:6379/0}" \
	$(PY) soak/run.py
	DATABASE_URL="$${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}" \
	REDIS_URL="$${REDIS_URL:-redis://127.0.0.1:6379/0}" \
	$(PY) benchmarks/overload.py --burst 2000 --check

# The server's image, sluice:latest (Containerfile, compose.yaml, docs/deploy.md "With
# containers"), with podman or docker. Needs no container registry: without one it builds its
# base from Debian's packages (scripts/image.sh).
image:
	scripts/image.sh
