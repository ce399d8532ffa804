# The two commands: `make run` and `make test`. Each bootstraps .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test e2e fuzz bench lint docs clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/cpctl serve $(ARGS)

# The suite runs on every core (pytest-xdist); TEST_WORKERS=0 runs it in one process.
# `make test` leaves out the slowest whole-system tests (marker e2e: several real server
# processes, replicas, a browser; listed in tests/conftest.py), which `make e2e` runs.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not e2e" $(PYTEST_ARGS)

e2e: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m e2e $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run.py

# The full contract fuzz run (every operation, every example); `make test` runs a smoke subset.
fuzz: $(STAMP)
	CONTROLPLANE_FUZZ=full $(PY) -m pytest tests/contract/test_fuzz.py $(PYTEST_ARGS)

# docs/reference/ is generated from the schemas, parsers and registries it describes; the suite
# fails while a page is stale (tests/docs/test_reference.py).
docs: $(STAMP)
	$(PY) -m service.reference

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict service

clean:
	rm -rf $(VENV) .state .pytest_cache .ruff_cache
