"""The embedded model beside llama.cpp (`make bench`): the same GGUF file
served by `rollcall model serve` and by llama.cpp's server
(llama-cpp-python[server], the build `make test` caches), with the same
number of threads, measured side by side in one run over each server's
HTTP API, and printed as a table with the ratio.

- prefill: prompts of about 128, 512 and 2,048 tokens, one output token;
  prompt tokens over the time to the answer (each prompt starts with a
  fresh salt, so no server reuses a cache);
- decode: tokens/s of a streamed greedy answer (time from its first to its
  last token) after those prompts;
- aggregate decode: 1, 4 and 8 streams at once (rollcall decodes them in
  one batch; llama-cpp-python's server takes one at a time);
- new weights from the same GGUF file: rollcall's hot reload while it
  serves (`POST /update_weights_from_disk`) beside what llama.cpp's server
  offers instead, a restart (start to first answer);
- peak RSS of each server.

A Hugging Face checkpoint directory (the same model written by
transformers) is reloaded too when transformers is installed; llama.cpp's
server cannot read one, so that row has no ratio.

Kernels: rollcall picks AVX-512 or AVX2 at run time; the cached llama.cpp
wheel is a portable AVX2 build (`LLAMACPP_CMAKE_ARGS` in the Makefile). Set
ROLLCALL_ENGINE_SIMD=avx2 to hold rollcall to AVX2 too.

    .venv/bin/python benches/engine_vs_llamacpp.py [--bin target/release/rollcall]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode} before it answered")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()
            return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"{what} did not answer within {timeout:.0f} s")


def post(url: str, body: dict):
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=900)


def text_of(n: int, salt: str) -> str:
    # about n tokens (each item is about 6); the servers' usage gives the count
    return f"{salt}: " + " ".join(f"item {i * 7 % 1000} of list;" for i in range(n // 6 + 1))


def prefill(url: str, n: int, salt: str) -> tuple[int, float]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Summarize: " + text_of(n, salt)}],
            "temperature": 0, "max_tokens": 1}
    t = time.perf_counter()
    d = json.load(post(url, body))
    return d["usage"]["prompt_tokens"], time.perf_counter() - t


def decode(url: str, n: int, salt: str, max_tokens: int = 96) -> tuple[int, float]:
    """Streamed greedy answer after a prompt of about `n` tokens: (tokens
    after the first, seconds from the first to the last)."""
    content = "Write a long story about a dragon and a lighthouse."
    if n > 64:
        content = text_of(n, salt) + "\n\n" + content
    else:
        content = f"{salt} {content}"
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, "stream": True}
    first = last = None
    count = 0
    with post(url, body) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            d = json.loads(line[5:])
            for c in d.get("choices") or []:
                if (c.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    count += 1
    if not first or count < 2:
        return 0, 1.0
    return count - 1, last - first


def aggregate(url: str, streams: int, salt: str) -> float:
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        t = time.perf_counter()
        results = list(pool.map(lambda i: decode(url, 16, f"{salt}-{i}", 64), range(streams)))
        wall = time.perf_counter() - t
    return sum(n + 1 for n, _ in results) / wall


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reload(url: str, path: str) -> float:
    """Seconds rollcall takes to put the weights at `path` in place."""
    started = time.time()
    req = urllib.request.Request(url + "/update_weights_from_disk", json.dumps({"model_path": path}).encode(),
                                 {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req, timeout=600))
    if not answer.get("success"):
        sys.exit(f"engine bench: the reload failed: {answer}")
    return time.time() - started


def restart(cmd: list[str], url: str, log: Path) -> float:
    """Seconds from starting a server to its first answer."""
    started = time.time()
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(url, p, "llama.cpp (restart)")
        return time.time() - started
    finally:
        p.terminate()
        p.wait(10)


def hf_directory(model: str, out: Path) -> str | None:
    """The GGUF model written as a Hugging Face checkpoint by transformers."""
    try:
        import torch
        import transformers
    except ImportError:
        print("engine bench: transformers is missing from this venv (make bench installs it): "
              "no safetensors-directory reload row", file=sys.stderr)
        return None
    g = Path(model)
    tok = transformers.AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "target/release/rollcall"))
    ap.add_argument("--model-file", default=os.environ.get("ROLLCALL_MODEL_FILE"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    model = args.model_file or subprocess.run([args.bin, "model", "fetch"], check=True, capture_output=True,
                                              text=True).stdout.strip().splitlines()[-1]
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("engine bench: llama-cpp-python is missing from this venv (make bench installs it)")
    logs = Path(tempfile.mkdtemp(prefix="rollcall-engine-bench-"))
    rc_port, lc_port = free_port(), free_port()
    ours = subprocess.Popen([args.bin, "model", "serve", "--listen", f"127.0.0.1:{rc_port}", "--model-file", model,
                             "--threads", str(args.threads), "--kv-slots", "8"],
                            stdout=open(logs / "rollcall.log", "w"), stderr=subprocess.STDOUT)
    llama = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(lc_port),
             "--n_threads", str(args.threads), "--n_ctx", "4096"]
    theirs = subprocess.Popen(llama, stdout=open(logs / "llama.log", "w"), stderr=subprocess.STDOUT)
    servers = {"rollcall": (f"http://127.0.0.1:{rc_port}", ours), "llama.cpp": (f"http://127.0.0.1:{lc_port}", theirs)}
    try:
        for name, (url, proc) in servers.items():
            wait_ready(url, proc, name)
            decode(url, 16, "warm-up", 8)
        rows = []
        salt = str(time.time())
        phases = [("prefill, ~{}-token prompt (tokens/s)", prefill, (128, 512, 2048)),
                  ("decode after ~{} tokens (tokens/s)", decode, (16, 512, 2048))]
        for label, measure, sizes in phases:
            for n in sizes:
                r = {}
                for name, (url, _) in servers.items():
                    toks, secs = measure(url, n, f"{salt}-{measure.__name__}{n}-{name}")
                    r[name] = toks / secs
                rows.append((label.format(n), r))
        for k in (1, 4, 8):
            r = {name: aggregate(url, k, f"{salt}-a{k}-{name}") for name, (url, _) in servers.items()}
            rows.append((f"{k} streams at once, in all (tokens/s)", r))
        rows.append(("peak RSS (MB)", {name: peak_rss_mb(p.pid) for name, (_, p) in servers.items()}))
        rc_url = servers["rollcall"][0]
        hot = reload(rc_url, model)
        theirs.terminate()
        theirs.wait(10)
        rows.append(("new weights, GGUF: hot reload / restart (s)",
                     {"rollcall": hot, "llama.cpp": restart(llama, f"http://127.0.0.1:{lc_port}", logs / "llama2.log")}))
        directory = hf_directory(model, logs / "hf")
        if directory:
            rows.append(("new weights, HF safetensors directory (s)",
                         {"rollcall": reload(rc_url, directory), "llama.cpp": float("nan")}))
            reload(rc_url, model)
    finally:
        for _, (_, p) in servers.items():
            p.terminate()
        for _, (_, p) in servers.items():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    print(f"\nembedded engine vs llama.cpp ({Path(model).name}, {args.threads} threads each, "
          f"llama-cpp-python {llama_cpp.__version__})")
    print(f"{'':44} {'rollcall':>10} {'llama.cpp':>10} {'ratio':>7}")
    for label, r in rows:
        a, b = r["rollcall"], r["llama.cpp"]
        digits = 2 if "(s)" in label else 1
        ratio = f"{a / b:7.2f}" if b == b else f"{'-':>7}"
        print(f"{label:44} {a:10.{digits}f} {b:10.{digits}f} {ratio}")


if __name__ == "__main__":
    main()
