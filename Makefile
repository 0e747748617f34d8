# The targets are the documentation of how to work on contextshift.
#   make build-dev   build the Rust extension into service/ (editable install in .venv)
#   make lint        ruff, mypy (+ stubtest of the _core stub), cargo fmt --check, cargo clippy
#   make test        lint, cargo test, pytest: what CI runs
#   make benchmark   the benchmark suite (QUICK=1 for a smoke run)

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install-dev build-dev lint test test-rust test-python benchmark clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet maturin -e '.[dev]'
	touch $(STAMP)

install-dev: $(STAMP)

# Rebuilds the extension in place after a Rust change (release profile: tests and benchmarks
# measure the code users get).
build-dev: $(STAMP)
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet

lint: build-dev
	$(VENV)/bin/ruff check service tests benchmarks
	$(VENV)/bin/ruff format --check service tests benchmarks
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest contextshift._core --allowlist stubtest-allowlist.txt
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

test-rust:
	cargo test --quiet -p contextshift-core

test-python: build-dev
	$(VENV)/bin/pytest -q

test: lint test-rust test-python

benchmark: build-dev
	$(PY) benchmarks/run.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) target
