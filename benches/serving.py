"""Serving an RL fleet through rollcall (`make bench`): measured in one run on
loopback, with real replicas of the scripted model server behind one pool
route, and prints a table.

1. Affinity hit rate while replicas leave and join: rollouts take turns; one
   replica is killed a third of the way in and restarted on its port two
   thirds in. The hit rate is the share of a rollout's calls served by its
   first replica (from the shards' `replica` column).
2. Affinity hit rate while replicas join and leave through the admin
   endpoint: a pool of 4; a fifth replica joins a third of the way in
   (`POST /v1/admin/resume` with `urls`), and one leaves two thirds in (a
   resume without it; it is then stopped). Half the rollouts start at the
   beginning, half at the join. Also: rollouts moved, the joiner's share of
   the calls after it joined, and calls failed (the harness got no 200).
3. Time to fail over: the latency of the first calls after a replica dies
   (their connect is refused and they go to the next replica), against calls
   before.
4. Added latency during pause/resume cycles (`hold` for 200 ms, then resume
   with a new policy version) at a steady concurrent load, against the same
   load without pauses.
5. Pool routing throughput against a single upstream, with wrk (C, light),
   side by side: a route of one replica, and a pool of four (affinity, one
   rollout id per connection).

    .venv/bin/python benches/serving.py [--bin target/release/rollcall]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import rollcall_harness as h  # noqa: E402

ADMIN = "bench-admin"


def affinity(rows: list[dict]) -> tuple[dict[str, list[dict]], list[float]]:
    """Each rollout's calls in order, and the share of them served by its
    first replica."""
    by: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["sequence"]):
        by.setdefault(r["rollout_id"], []).append(r)
    hits = [sum(1 for c in cs if c["replica"] == cs[0]["replica"]) / len(cs) for cs in by.values()]
    return by, hits

def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def start_replica(work: Path, name: str, port: int = 0) -> h.Proc:
    return h.Proc(["--listen", f"127.0.0.1:{port}"], "scripted upstream listening on ",
                  work / f"{name}.stderr", bin=h.scripted_upstream_bin())


def pool_toml(urls: list[str]) -> str:
    quoted = ", ".join(f'"{u}/v1"' for u in urls)
    return f"""
[server]
admin_keys_env = "BENCH_ADMIN_KEYS"
[shards]
max_age_secs = 0.5
max_rows = 1000000
[[routes]]
name = "pool"
urls = [{quoted}]
policy = "affinity"
health_interval_ms = 200
down_cooldown_ms = 2000
"""


def call(base: str, rollout: str, text: str, model: str = "m") -> float:
    t = time.perf_counter()
    r = h.post_json(base, f"/rollouts/{rollout}/v1/chat/completions",
                    {"model": model, "messages": [{"role": "user", "content": text}]})
    if r.status != 200:
        raise SystemExit(f"bench: a call failed ({r.status}): {r.body[:300]!r}")
    return time.perf_counter() - t


def admin(base: str, path: str, body: dict) -> None:
    r = h.raw_request(base, "POST", path, json.dumps(body).encode(),
                      {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    if r.status != 200:
        raise SystemExit(f"bench: {path} answered {r.status}: {r.body!r}")


def affinity_and_failover(work: Path, rollouts: int, turns: int) -> dict:
    reps = [start_replica(work, f"r{i}") for i in range(4)]
    ports = [int(r.url.rsplit(":", 1)[1]) for r in reps]
    proxy = h.start_proxy(work / "aff", reps[0].url, toml=pool_toml([r.url for r in reps]),
                          env={"BENCH_ADMIN_KEYS": ADMIN})
    lat_before: list[float] = []
    lat_after_kill: list[float] = []
    try:
        ids = [f"aff-{i}" for i in range(rollouts)]
        with ThreadPoolExecutor(8) as ex:
            for turn in range(turns):
                if turn == turns // 3:
                    reps[1].kill()
                if turn == 2 * turns // 3:
                    reps[1] = start_replica(work, "r1-again", ports[1])
                    time.sleep(0.5)  # a probe interval or two
                lats = list(ex.map(lambda r: call(proxy.url, r, f"{r} turn {turn}"), ids))
                if turn == turns // 3 - 1:
                    lat_before = lats
                if turn == turns // 3:
                    lat_after_kill = lats
        h.wait_for_shards(proxy.url)
        rows = h.duck_dicts(proxy.shards, "SELECT rollout_id, sequence, replica, repinned FROM t")
    finally:
        proxy.kill()
        for r in reps:
            r.kill()
    by, hits = affinity(rows)
    dead = f"{reps[1].url}/v1"
    moved = sum(1 for cs in by.values() if cs[0]["replica"] == dead)
    return {
        "calls": len(rows),
        "hit_rate": statistics.mean(hits),
        "moved_rollouts": moved,
        "repins": sum(1 for r in rows if r["repinned"]),
        "before_p50": pct(lat_before, 50), "before_p99": pct(lat_before, 99),
        "kill_p50": pct(lat_after_kill, 50), "kill_p99": pct(lat_after_kill, 99),
        "kill_max": max(lat_after_kill) if lat_after_kill else float("nan"),
    }


def join_and_leave(work: Path, rollouts: int, turns: int) -> dict:
    reps = [start_replica(work, f"j{i}") for i in range(5)]
    v1 = [f"{r.url}/v1" for r in reps]
    proxy = h.start_proxy(work / "join", reps[0].url, toml=pool_toml([r.url for r in reps[:4]]),
                          env={"BENCH_ADMIN_KEYS": ADMIN})
    failed = 0
    lock = threading.Lock()

    def one(rollout: str, text: str) -> None:
        nonlocal failed
        r = h.post_json(proxy.url, f"/rollouts/{rollout}/v1/chat/completions",
                        {"model": "m", "messages": [{"role": "user", "content": text}]})
        if r.status != 200:
            with lock:
                failed += 1

    join_at, leave_at = turns // 3, 2 * turns // 3
    early = [f"jl-a{i}" for i in range(rollouts // 2)]
    late = [f"jl-b{i}" for i in range(rollouts - rollouts // 2)]
    leaver = v1[1]
    try:
        with ThreadPoolExecutor(8) as ex:
            for turn in range(turns):
                if turn == join_at:
                    admin(proxy.url, "/v1/admin/resume", {"policy_version": 1, "route": "pool", "urls": v1})
                if turn == leave_at:
                    admin(proxy.url, "/v1/admin/resume",
                          {"policy_version": 2, "route": "pool", "urls": [u for u in v1 if u != leaver]})
                    reps[1].kill()  # scaled down: nothing may reach it now
                ids = early + (late if turn >= join_at else [])
                list(ex.map(lambda r: one(r, f"{r} turn {turn}"), ids))
        h.wait_for_shards(proxy.url)
        rows = h.duck_dicts(proxy.shards, "SELECT rollout_id, sequence, status, replica, repinned, "
                                          "policy_version FROM t")
    finally:
        proxy.kill()
        for r in reps:
            r.kill()
    by, hits = affinity(rows)
    after_join = [r for r in rows if (r["policy_version"] or 0) >= 1]
    return {
        "calls": len(rows),
        "hit_rate": statistics.mean(hits),
        "moved_rollouts": sum(1 for cs in by.values() if len({c["replica"] for c in cs}) > 1),
        "on_leaver": sum(1 for cs in by.values() if any(c["replica"] == leaver for c in cs)),
        "moved_others": sum(1 for cs in by.values() if len({c["replica"] for c in cs}) > 1
                            and all(c["replica"] != leaver for c in cs)),
        "repins": sum(1 for r in rows if r["repinned"]),
        "joiner_share": sum(1 for r in after_join if r["replica"] == v1[4]) / max(1, len(after_join)),
        "leaver_after": sum(1 for r in rows if (r["policy_version"] or 0) >= 2 and r["replica"] == leaver),
        "failed": failed,
    }


def pause_cycles(work: Path, seconds: float, cycles: int) -> dict:
    rep = start_replica(work, "p0")
    proxy = h.start_proxy(work / "pause", rep.url, toml=pool_toml([rep.url]), env={"BENCH_ADMIN_KEYS": ADMIN})
    try:
        def load(duration: float) -> list[float]:
            out: list[float] = []
            stop = time.time() + duration

            def worker(k: int) -> None:
                n = 0
                while time.time() < stop:
                    out.append(call(proxy.url, f"load-{k}", f"call {n}"))
                    n += 1
            ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return out

        base = load(seconds)
        lats: list[float] = []
        runner = threading.Thread(target=lambda: lats.extend(load(seconds)))
        runner.start()
        gap = seconds / (cycles + 1)
        for v in range(1, cycles + 1):
            time.sleep(max(0.0, gap - 0.2))
            admin(proxy.url, "/v1/admin/pause", {"mode": "hold"})
            time.sleep(0.2)
            admin(proxy.url, "/v1/admin/resume", {"policy_version": v})
        runner.join()
    finally:
        proxy.kill()
        rep.kill()
    return {"base_p50": pct(base, 50), "base_p99": pct(base, 99), "cyc_p50": pct(lats, 50),
            "cyc_p99": pct(lats, 99), "base_n": len(base), "cyc_n": len(lats), "cycles": cycles}


WRK_LUA = """
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", "/rollouts/wrk-" .. (n % 512) .. "/v1/chat/completions",
    {["Content-Type"] = "application/json"},
    '{"model":"m","messages":[{"role":"user","content":"hi"}]}')
end
"""


def wrk(url: str, script: Path, conns: int, secs: int) -> float:
    out = subprocess.run(["wrk", "-t2", f"-c{conns}", f"-d{secs}s", "-s", str(script), url],
                         capture_output=True, text=True, timeout=secs + 60).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise SystemExit(f"bench: wrk printed no rate:\n{out}")
    return float(m.group(1))


def throughput(work: Path, secs: int) -> dict:
    if not shutil.which("wrk"):
        raise SystemExit("bench: wrk is missing: run `make bench-tools`")
    reps = [start_replica(work, f"t{i}") for i in range(4)]
    single = start_replica(work, "single")
    # Two proxies, the same binary and settings: a route of one, and a pool of four.
    p_pool = h.start_proxy(work / "tp-pool", reps[0].url, toml=pool_toml([r.url for r in reps]),
                           env={"BENCH_ADMIN_KEYS": ADMIN}, name="pool")
    p_one = h.start_proxy(work / "tp-one", single.url, toml=pool_toml([single.url]),
                          env={"BENCH_ADMIN_KEYS": ADMIN}, name="one")
    script = work / "post.lua"
    script.write_text(WRK_LUA)
    res: dict[str, list[float]] = {"one": [], "pool": []}
    try:
        for _ in range(2):  # interleaved rounds
            res["one"].append(wrk(p_one.url, script, 64, secs))
            res["pool"].append(wrk(p_pool.url, script, 64, secs))
    finally:
        for p in (p_pool, p_one):
            p.kill()
        for r in reps + [single]:
            r.kill()
    return {k: statistics.mean(v) for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/rollcall"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not Path(a.bin).exists():
        raise SystemExit(f"bench: {a.bin} is missing: cargo build --release")
    os.environ["ROLLCALL_BIN"] = str(Path(a.bin).resolve())
    work = Path(tempfile.mkdtemp(prefix="rollcall-serving-bench-"))
    try:
        aff = affinity_and_failover(work, 40 if a.quick else 120, 6 if a.quick else 12)
        jl = join_and_leave(work, 40 if a.quick else 120, 6 if a.quick else 12)
        pau = pause_cycles(work, 4 if a.quick else 12, 3 if a.quick else 8)
        tp = throughput(work, 3 if a.quick else 10)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ms = 1000
    print(f"""## Serving bench ({os.cpu_count()} CPUs, {Path(a.bin).name} at {a.bin})

| | figure |
|---|---|
| affinity hit rate (share of a rollout's calls on its first replica), one of 4 replicas leaving then rejoining | {aff['hit_rate']:.3f} over {aff['calls']} calls; {aff['moved_rollouts']} rollouts moved, {aff['repins']} re-pins recorded |
| affinity hit rate, replicas joining and leaving by resume with `urls` (4 replicas, a 5th joins a third in, one leaves two thirds in) | {jl['hit_rate']:.3f} over {jl['calls']} calls; {jl['moved_rollouts']} rollouts moved ({jl['on_leaver']} were on the replica that left, {jl['moved_others']} were not), {jl['repins']} re-pins recorded, {jl['failed']} calls failed |
| share of the calls after the join served by the joiner; calls sent to the leaver after it left | {jl['joiner_share']:.3f}; {jl['leaver_after']} |
| call latency just before the replica died, p50 / p99 | {aff['before_p50'] * ms:.1f} / {aff['before_p99'] * ms:.1f} ms |
| call latency of the first turn after it died (fail over on connect refused), p50 / p99 / max | {aff['kill_p50'] * ms:.1f} / {aff['kill_p99'] * ms:.1f} / {aff['kill_max'] * ms:.1f} ms |
| latency at 8 concurrent callers without pauses, p50 / p99 | {pau['base_p50'] * ms:.1f} / {pau['base_p99'] * ms:.1f} ms ({pau['base_n']} calls) |
| latency during {pau['cycles']} pause/resume cycles (hold 200 ms each), p50 / p99 | {pau['cyc_p50'] * ms:.1f} / {pau['cyc_p99'] * ms:.1f} ms ({pau['cyc_n']} calls) |
| added latency during the cycles, p50 / p99 | {(pau['cyc_p50'] - pau['base_p50']) * ms:+.1f} / {(pau['cyc_p99'] - pau['base_p99']) * ms:+.1f} ms |
| wrk, 64 connections: single upstream / pool of 4 (affinity, 512 rollouts) | {tp['one']:.0f} / {tp['pool']:.0f} calls/s ({tp['pool'] / tp['one']:.2f}x) |

The Python callers (sections 1-4) cost more CPU than the proxy; compare
figures within a row. wrk (section 5) runs two interleaved rounds per
target on the same 2 cores as the proxy and the replicas.""")


if __name__ == "__main__":
    main()
