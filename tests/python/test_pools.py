"""Upstream pools on loopback: several real replicas of the scripted model
server behind one route. Affinity keeps a rollout on one replica; killing a
replica mid-run fails its rollouts over without losing a call; the other
policies spread the load; every row names the replica that served it."""

from __future__ import annotations

from collections import Counter, defaultdict

import subprocess

import pytest

import rollcall_harness as h


def pool_toml(urls: list[str], policy: str = "affinity", extra: str = "") -> str:
    quoted = ", ".join(f'"{u}/v1"' for u in urls)
    return f"""
[shards]
max_age_secs = 0.2
max_rows = 100000
[[routes]]
name = "pool"
urls = [{quoted}]
policy = "{policy}"
health_interval_ms = 200
down_cooldown_ms = 60000
{extra}
"""


@pytest.fixture
def replicas(tmp_path):
    procs = [h.start_upstream(tmp_path / f"r{i}", name=f"r{i}") for i in range(3)]
    yield procs
    for p in procs:
        p.kill()


def chat(base: str, rollout: str, text: str, stream: bool = False, model: str = "m") -> h.RawResponse:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    return h.post_json(base, f"/rollouts/{rollout}/v1/chat/completions", body)


def rows(proxy) -> list[dict]:
    h.wait_for_shards(proxy.url)
    return h.duck_dicts(proxy.shards, "SELECT rollout_id, sequence, status, replica, repinned FROM t")


def test_affinity_holds_and_a_dead_replica_fails_over_without_losing_a_call(replicas, make_proxy):
    urls = [r.url for r in replicas]
    proxy = make_proxy(toml=pool_toml(urls))
    rollouts = [f"aff-{i}" for i in range(24)]
    for turn in range(3):
        for r in rollouts:
            resp = chat(proxy.url, r, f"{r} turn {turn}", stream=turn % 2 == 1)
            assert resp.status == 200, resp.body
    before = rows(proxy)
    by = defaultdict(set)
    for row in before:
        by[row["rollout_id"]].add(row["replica"])
    assert all(len(v) == 1 for v in by.values()), by
    home = {r: next(iter(v)) for r, v in by.items()}
    spread = Counter(home.values())
    assert len(spread) == 3, spread
    assert {row["replica"] for row in before} == {f"{u}/v1" for u in urls}
    assert not any(row["repinned"] for row in before)

    # Kill one replica mid-run: its rollouts move, the others stay put.
    dead = f"{urls[0]}/v1"
    replicas[0].kill()
    for turn in range(3, 6):
        for r in rollouts:
            resp = chat(proxy.url, r, f"{r} turn {turn}", stream=turn % 2 == 1)
            assert resp.status == 200, (r, resp.status, resp.body)
    after = [row for row in rows(proxy) if row["sequence"] >= 3]
    assert len(after) == 3 * len(rollouts)
    assert all(row["status"] == "ok" for row in after), [r for r in after if r["status"] != "ok"]
    moved = defaultdict(list)
    for row in sorted(after, key=lambda x: x["sequence"]):
        moved[row["rollout_id"]].append(row)
    for r, calls in moved.items():
        replicas_now = {c["replica"] for c in calls}
        assert dead not in replicas_now
        assert len(replicas_now) == 1, (r, calls)
        if home[r] == dead:
            # The move is recorded on the first call after it.
            assert calls[0]["repinned"] is True and not any(c["repinned"] for c in calls[1:])
        else:
            assert replicas_now == {home[r]} and not any(c["repinned"] for c in calls)


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded"])
def test_other_policies_spread_calls(replicas, make_proxy, policy):
    proxy = make_proxy(toml=pool_toml([r.url for r in replicas], policy=policy))
    # Six calls at once, each held 400 ms by the upstream: round robin takes
    # turns, least-loaded puts each on the replica with the fewest in flight.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(6) as ex:
        done = list(ex.map(lambda i: chat(proxy.url, "one-rollout", f"call {i}", model="m@ttfb_ms=400"), range(6)))
    assert all(r.status == 200 for r in done)
    got = Counter(row["replica"] for row in rows(proxy))
    assert sorted(got.values()) == [2, 2, 2], got


def test_a_pool_route_is_validated(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[routes]]\nname = "p"\nurls = ["ftp://x/v1"]\n')
    p = subprocess.run([h.rollcall_bin(), "serve", "--config", str(bad), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "must start with http" in p.stderr, p.stderr
    bad.write_text('[[routes]]\nname = "p"\nurls = ["http://127.0.0.1:1/v1"]\npolicy = "random"\n')
    p = subprocess.run([h.rollcall_bin(), "serve", "--config", str(bad), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "random" in p.stderr, p.stderr
