# The two commands: `make run` and `make test`. Each bootstraps .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench lint clean

$(STAMP): pyproject.toml setup.py service/_regonative.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@rm -f service/_regonative*.so  # never keep a stale build of the optional C extension
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/cpctl serve $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .state .pytest_cache .ruff_cache
