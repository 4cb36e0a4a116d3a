# `make demo` runs the quickstart, `make test` runs the tests (`make
# test-repro` the longer real-run checks), `make lint`
# runs ruff and mypy (both in the `test` extra). Each creates .venv on first
# use and installs what it needs (torch pinned to the CPU wheel through
# constraints.txt, before anything that depends on it).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

# ruff covers every Python directory; mypy checks what [tool.mypy] lists.
LINT_DIRS := fedsim netem tests tools

.PHONY: demo test test-repro lint bench clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fedsim run scenarios/quickstart.toml

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# the longer real-run checks: the reproductions' fast subset (the claims'
# mechanisms with margins, tests/repro/test_claims_fast.py) and the insider
# test (tests/integration/test_insider.py); CI runs them after `make test`
test-repro: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python tools/bench_wire.py
	$(BIN)/python tools/bench_netem.py

clean:
	rm -rf $(VENV) runs
