# rollcall — see README.md. Every target works on a fresh machine with the
# Rust toolchain and Python 3.11; Python packages come from PyPI into venvs.

PYTHON ?= python3
VENV := .venv
LITELLM_VENV := .venv-litellm
BIN := target/release/rollcall

.PHONY: all build test lint demo bench clean

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

# Rust unit and integration tests, then the Python suite (openai SDK,
# pyarrow, DuckDB) against the debug binary.
test: $(VENV)/.installed
	cargo build
	cargo test
	$(VENV)/bin/python -m pytest tests/python -q

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

# The main job end to end: a scripted upstream, rollcall in front of it,
# a few agent rollouts through it, and what landed in the shards.
demo: build $(VENV)/.installed
	$(VENV)/bin/python harness-adapters/scripted-agent/demo.py --bin $(BIN)

# Criterion benches, then direct vs rollcall vs LiteLLM side by side.
bench: $(LITELLM_VENV)/.installed
	cargo bench --bench record
	cargo bench --bench compare

clean:
	cargo clean
	rm -rf $(VENV) $(LITELLM_VENV) demo-out
