#!/usr/bin/env python3
"""Bench the job API of `rollcall serve` against `rollcall batch` with the
same settings, interleaved in one run, and the time a trainer waits for a
group after its last grade.

The shipped task family (fixtures/tasks/inflection, 10 tasks, images from
`make task-image`), the scripted model server (`scripted-upstream`, beside
`--bin`) and mini-swe-agent (under $ROLLCALL_HARNESS_DIR, default
~/.cache/rollcall/harnesses). Half of the tasks end with the gold fix and
the submit command, the rest with the submit only, as in benches/batch.py.

Per round (ROUNDS rounds, the two orders alternating), each in fresh
shards of its own:
  * batch: `rollcall batch --proxy URL` against a fresh `rollcall serve`
    (so both sides record through the same kind of proxy), wall time from
    the command's start to its exit;
  * job: `POST /v1/jobs` to a fresh `rollcall serve` with the same tasks,
    harness, samples and concurrency, wall time from the POST to the
    answer that says the job is done (all groups received), while a
    trainer-like client long-polls `GET /v1/jobs/{id}/groups?wait=30`.

Figures:
  * rollouts per minute for each, and job / batch (target >= 0.95);
  * group latency: for each group, the time the client received it minus
    the latest `finished_at` of its samples' finish rows (the finish the
    engine posts once a sample is graded), p50 and p99, over all rounds.

    .venv/bin/python benches/jobs.py [--bin target/release/rollcall] [--samples 2] [--concurrency 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import rollcall_harness as h  # noqa: E402

FAMILY = REPO / "fixtures" / "tasks" / "inflection" / "tasks.jsonl"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
ADMIN = "bench-admin"
TOML = """
[server]
admin_keys_env = "BENCH_ADMIN_KEYS"
[shards]
max_age_secs = 1.0
[[routes]]
name = "scripted"
url = "{upstream}/v1"
kind = "vllm"
"""


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def tasks() -> list[dict]:
    family = [json.loads(line) for line in FAMILY.read_text().splitlines() if line.strip()]
    out = []
    for i, t in enumerate(family):
        cmds = []
        if i % 2 == 0:
            b = base64.b64encode(t["patch"].encode()).decode()
            cmds.append(f"echo {b} | base64 -d | git apply")
        cmds.append(SUBMIT)
        t = dict(t)
        t["problem_statement"] += "\n\n" + " ".join(f"[[run: {c}]]" for c in cmds)
        out.append(t)
    return out


def env() -> dict:
    e = dict(os.environ)
    e.setdefault("ROLLCALL_HARNESS_DIR", str(Path.home() / ".cache" / "rollcall" / "harnesses"))
    e["ROLLCALL_PROGRESS"] = "0"
    e["BENCH_ADMIN_KEYS"] = ADMIN
    return e


def serve(dir: Path, upstream: str) -> h.Proxy:
    return h.start_proxy(dir, upstream, toml=TOML.format(upstream=upstream), env=env())


def api(base: str, method: str, path: str, body=None, timeout: float = 120.0) -> h.RawResponse:
    data = None if body is None else json.dumps(body).encode()
    return h.raw_request(base, method, path, data, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=timeout)


def finishes(shards: Path) -> dict[str, int]:
    rows = h.duck_dicts(shards, "SELECT rollout_id, epoch_us(finished_at) AS fin FROM t", kind="rollouts")
    out: dict[str, int] = {}
    for r in rows:
        out[r["rollout_id"]] = max(out.get(r["rollout_id"], 0), r["fin"])
    return out


def run_batch(bin_path: Path, dir: Path, upstream: str, tasks_file: Path, a) -> dict:
    p = serve(dir, upstream)
    try:
        cmd = [str(bin_path), "batch", "--tasks", str(tasks_file), "--harness", "mini-swe-agent",
               "--model", "scripted", "--samples", str(a.samples), "--concurrency", str(a.concurrency),
               "--shards", str(p.shards), "--proxy", p.url, "--out", str(dir / "out"), "--name", "bench",
               "--timeout", "300", "--grade-timeout", "300"]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=3600)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"rollcall batch failed:\n{r.stderr[-3000:]}")
        summary = json.loads((dir / "out" / "summary.json").read_text())
        return {"wall": wall, "rollouts": summary["rollouts"], "resolved": summary["resolved"]}
    finally:
        p.kill()


def run_job(dir: Path, upstream: str, tasks_file: Path, a) -> dict:
    p = serve(dir, upstream)
    try:
        body = {"tasks": str(tasks_file), "harness": "mini-swe-agent", "model": "scripted",
                "samples": a.samples, "concurrency": a.concurrency, "timeout_secs": 300, "grade_timeout_secs": 300}
        received: list[tuple[dict, int]] = []
        t0 = time.monotonic()
        r = api(p.url, "POST", "/v1/jobs", body)
        if r.status != 201:
            raise SystemExit(f"the job was refused: {r.body[:2000]!r}")
        job = r.json()["id"]
        cursor = 0
        while True:
            page = api(p.url, "GET", f"/v1/jobs/{job}/groups?after={cursor}&wait=30", timeout=90).json()
            now = int(time.time() * 1e6)
            received += [(g, now) for g in page["groups"]]
            cursor = page["cursor"]
            if page["done"] and not page["groups"]:
                break
        wall = time.monotonic() - t0
        st = api(p.url, "GET", f"/v1/jobs/{job}").json()
        if st["state"] != "done":
            raise SystemExit(f"the job ended {st['state']}: {st.get('error')}")
        fins = finishes(p.shards)
        lat = []
        for g, at in received:
            last = max(fins[s["rollout_id"]] for s in g["samples"])
            lat.append((at - last) / 1000.0)
        return {"wall": wall, "rollouts": st["counts"]["done"], "resolved": st["counts"]["resolved"], "latency_ms": lat}
    finally:
        p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "rollcall"))
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    bin_path = Path(a.bin).resolve()
    os.environ["ROLLCALL_BIN"] = str(bin_path)
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        raise SystemExit("no Docker daemon answers: run .ci/docker-up")
    work = Path(tempfile.mkdtemp(prefix="rollcall-bench-jobs-"))
    tasks_file = work / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in tasks()))
    up = h.start_upstream(work / "upstream")
    results: dict[str, list[dict]] = {"batch": [], "job": []}
    try:
        for rnd in range(a.rounds):
            order = ["job", "batch"] if rnd % 2 == 0 else ["batch", "job"]
            for kind in order:
                d = work / f"{kind}-{rnd}"
                r = run_job(d, up.url, tasks_file, a) if kind == "job" else run_batch(bin_path, d, up.url, tasks_file, a)
                per_min = r["rollouts"] / r["wall"] * 60
                results[kind].append(r | {"per_min": per_min})
                print(f"round {rnd + 1} {kind:5}: {r['rollouts']} rollouts ({r['resolved']} resolved) "
                      f"in {r['wall']:.1f} s = {per_min:.1f} rollouts/min", flush=True)
    finally:
        up.kill()
    b = sum(r["rollouts"] for r in results["batch"]) / sum(r["wall"] for r in results["batch"]) * 60
    j = sum(r["rollouts"] for r in results["job"]) / sum(r["wall"] for r in results["job"]) * 60
    lat = [x for r in results["job"] for x in r["latency_ms"]]
    print()
    print(f"job API vs rollcall batch ({len(tasks())} tasks x {a.samples} samples, concurrency {a.concurrency}, "
          f"{a.rounds} rounds interleaved, scripted model, mini-swe-agent, {os.cpu_count()} cores)")
    print(f"| figure | rollcall batch | job API | ratio | target |")
    print(f"|---|---|---|---|---|")
    print(f"| rollouts per minute | {b:.1f} | {j:.1f} | {j / b:.3f} | >= 0.95 |")
    print(f"| group latency: last grade -> trainer (ms), p50 / p99 over {len(lat)} groups | | "
          f"{pct(lat, 0.5):.1f} / {pct(lat, 0.99):.1f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
