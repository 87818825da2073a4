# rollcall — see README.md. Every target works on a fresh machine with the
# Rust toolchain and Python 3.11; Python packages come from PyPI into venvs.

PYTHON ?= python3
VENV := .venv
LITELLM_VENV := .venv-litellm
BIN := target/release/rollcall

HARNESS_DIR := .harnesses

.PHONY: all build test lint demo bench clean harnesses fixtures

all: build

build:
	cargo build --release

$(VENV)/.installed: tests/python/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
	touch $@

$(LITELLM_VENV)/.installed: benches/litellm/requirements.txt
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet --disable-pip-version-check -r benches/litellm/requirements.txt
	touch $@

# The agent harnesses at their pinned versions (npm, pip, cargo), into
# $(HARNESS_DIR). Idempotent; ZeroClaw's first build takes about 20 minutes.
harnesses:
	cargo build
	target/debug/rollcall harness install --all --prefix $(HARNESS_DIR)

# Rust unit and integration tests, then the Python suite (openai SDK,
# pyarrow, DuckDB, real harness CLIs) against the debug binary.
test: $(VENV)/.installed harnesses
	cargo test
	ROLLCALL_HARNESS_DIR=$(HARNESS_DIR) ROLLCALL_REQUIRE_HARNESSES=1 \
		$(VENV)/bin/python -m pytest tests/python -q

# Capture each harness's exchange again into fixtures/<name>/.
fixtures: $(VENV)/.installed harnesses
	$(VENV)/bin/python fixtures/capture.py --harness-dir $(HARNESS_DIR)

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

# The main job end to end: a scripted upstream, rollcall in front of it,
# a few agent rollouts through it, and what landed in the shards.
demo: build $(VENV)/.installed
	$(VENV)/bin/python harness-adapters/scripted-agent/demo.py --bin $(BIN)

# Criterion benches, then direct vs rollcall vs LiteLLM side by side, then
# the dataset export over 1,000,000 generated call rows (rows/s, peak RSS).
bench: $(LITELLM_VENV)/.installed
	cargo bench --bench record
	cargo bench --bench compare
	cargo bench --bench export

clean:
	cargo clean
	rm -rf $(VENV) $(LITELLM_VENV) $(HARNESS_DIR) demo-out
