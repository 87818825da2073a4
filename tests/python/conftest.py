"""Fixtures: a scripted upstream (shared by the session) and proxies started
on free loopback ports with a per-test shards directory. Every process a
fixture starts is killed at teardown."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rollcall_harness as h  # noqa: E402


def pytest_configure(config):
    bridge = str(Path(h.rollcall_bin()).with_name("rollcall-bridge"))
    for path in (h.rollcall_bin(), h.scripted_upstream_bin(), bridge):
        if not os.path.exists(path):
            raise pytest.UsageError(
                f"{Path(path).name} binary not found at {path}: run `cargo build` or set ROLLCALL_BIN"
                " (scripted-upstream is looked for beside it)"
            )


@pytest.fixture(scope="session")
def gguf() -> Path:
    """The shipped GGUF model file (`rollcall model fetch` caches it; make test
    fetches it), or ROLLCALL_MODEL_FILE; missing is a failure, never a skip."""
    p = h.model_file()
    if not p.exists():
        pytest.fail(f"{p} is missing: run `rollcall model fetch` (make test does) or set ROLLCALL_MODEL_FILE")
    return p


@pytest.fixture(scope="session")
def upstream(tmp_path_factory):
    """The scripted model server: returns its base URL (no /v1)."""
    proc = h.start_upstream(tmp_path_factory.mktemp("upstream"))
    yield proc.url
    proc.kill()


@pytest.fixture
def make_proxy(tmp_path, upstream):
    """Factory: `make_proxy(toml=..., shards=..., name=...)` starts a proxy in
    front of the scripted upstream. All of them are killed at teardown."""
    started: list[h.Proxy] = []

    def make(toml: str = h.DEFAULT_TOML, shards: Path | None = None, env: dict | None = None,
             name: str = "proxy") -> h.Proxy:
        p = h.start_proxy(tmp_path, upstream, toml=toml, shards=shards, env=env, name=name)
        started.append(p)
        return p

    yield make
    for p in started:
        p.kill()


@pytest.fixture
def proxy(make_proxy):
    """A proxy with quick shard publishing and untagged calls allowed."""
    return make_proxy()
