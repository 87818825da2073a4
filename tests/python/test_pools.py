"""Upstream pools on loopback: several real replicas of the scripted model
server (and of the embedded model) behind one route. Affinity keeps a rollout on one replica; killing a
replica mid-run fails its rollouts over without losing a call; the other
policies spread the load; every row names the replica that served it."""

from __future__ import annotations

from collections import Counter, defaultdict

import json
import subprocess
import threading
import time

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


ADMIN = "pool-admin"


def admin(base: str, path: str, body: dict | None = None) -> h.RawResponse:
    data = json.dumps(body).encode() if body is not None else None
    return h.raw_request(base, "POST" if body is not None else "GET", path, data,
                         {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})


def test_resume_with_urls_replaces_the_replicas_and_moves_only_the_leavers_rollouts(replicas, make_proxy, tmp_path):
    """Three replicas; a resume adds a fourth and removes one. Rollouts on the
    kept replicas stay; the removed one's move (recorded as re-pinned) and it
    takes no new call, while the call it was serving finishes; no call fails."""
    joiner = h.start_upstream(tmp_path / "r3", name="r3")
    try:
        urls = [r.url for r in replicas]
        cfg = pool_toml(urls).replace("[shards]", f'[server]\nadmin_keys_env = "TEST_ADMIN_KEYS"\n[shards]', 1)
        proxy = make_proxy(toml=cfg, env={"TEST_ADMIN_KEYS": ADMIN})
        v1 = [f"{u}/v1" for u in urls]
        st = admin(proxy.url, "/v1/admin/status").json()
        assert st["routes"]["pool"]["replicas"] == v1, st

        rollouts = [f"move-{i}" for i in range(30)]
        for turn in range(2):
            for r in rollouts:
                resp = chat(proxy.url, r, f"{r} turn {turn}", stream=turn % 2 == 1)
                assert resp.status == 200, resp.body
        home = {}
        for row in rows(proxy):
            assert home.setdefault(row["rollout_id"], row["replica"]) == row["replica"], row
        assert set(home.values()) == set(v1), Counter(home.values())

        # Bad lists are refused whole, in the endpoint's error shape.
        for body, code in [
            ({"urls": [f"{joiner.url}/v1"]}, "invalid_body"),  # no route
            ({"route": "pool", "urls": []}, "invalid_urls"),
            ({"route": "pool", "urls": [v1[0], v1[0] + "/"]}, "invalid_urls"),
            ({"route": "pool", "urls": ["ftp://127.0.0.1:1/v1"]}, "invalid_urls"),
            ({"route": "pool", "urls": "http://127.0.0.1:1/v1"}, "invalid_body"),
        ]:
            r = admin(proxy.url, "/v1/admin/resume", body)
            assert r.status == 400 and r.json()["error"]["code"] == code, (body, r.status, r.body)
        assert admin(proxy.url, "/v1/admin/resume", {"route": "nope", "urls": v1}).status == 404
        assert admin(proxy.url, "/v1/admin/status").json()["routes"]["pool"]["replicas"] == v1

        # A slow call is on the replica that leaves when the resume comes.
        gone = v1[1]
        slow_rollout = next(r for r in rollouts if home[r] == gone)
        out: dict = {}
        slow = threading.Thread(target=lambda: out.setdefault(
            "r", chat(proxy.url, slow_rollout, "slow one", model="m@ttfb_ms=1500")))
        slow.start()
        time.sleep(0.4)
        new_urls = [v1[0], v1[2], f"{joiner.url}/v1"]
        r = admin(proxy.url, "/v1/admin/resume", {"policy_version": 1, "route": "pool", "urls": new_urls})
        assert r.status == 200, r.body
        assert r.json()["routes"]["pool"]["replicas"] == new_urls
        assert r.json()["routes"]["pool"]["policy_version"] == 1
        slow.join(30)
        assert out["r"].status == 200, out["r"].body

        fresh = [f"fresh-{i}" for i in range(30)]
        for turn in range(2, 4):
            for rid in rollouts + fresh:
                resp = chat(proxy.url, rid, f"{rid} turn {turn}", stream=turn % 2 == 1)
                assert resp.status == 200, (rid, resp.status, resp.body)
        all_rows = rows(proxy)
        assert all(row["status"] == "ok" for row in all_rows), [x for x in all_rows if x["status"] != "ok"]
        slow_row = [x for x in all_rows if x["rollout_id"] == slow_rollout and x["sequence"] == 2]
        assert slow_row and slow_row[0]["replica"] == gone, slow_row
        after = defaultdict(list)
        for row in sorted(all_rows, key=lambda x: x["sequence"]):
            if row["rollout_id"] in fresh or row["sequence"] >= 2 + (row["rollout_id"] == slow_rollout):
                after[row["rollout_id"]].append(row)
        moved = 0
        for rid in rollouts:
            calls = after[rid]
            assert len(calls) == 2, (rid, calls)
            now = {c["replica"] for c in calls}
            assert len(now) == 1 and gone not in now, (rid, calls)
            if home[rid] == gone:
                moved += 1
                assert calls[0]["repinned"] is True and calls[1]["repinned"] is False, (rid, calls)
            else:
                assert now == {home[rid]} and not any(c["repinned"] for c in calls), (rid, calls)
        assert moved == sum(1 for r in rollouts if home[r] == gone) > 0
        served_after = Counter(c["replica"] for cs in after.values() for c in cs)
        assert gone not in served_after and f"{joiner.url}/v1" in served_after, served_after
    finally:
        joiner.kill()


def test_a_pool_of_embedded_model_replicas_keeps_affinity_and_fails_over(gguf, make_proxy, tmp_path):
    """Two replicas of the embedded model (`rollcall model serve`, real
    GGUF inference, vLLM's shape) behind a vLLM-kind pool: each rollout's
    calls stay on one replica with token ids captured, and when a replica is
    killed its rollouts fail over to the other without losing a call."""
    procs = [h.Proc(["model", "serve", "--listen", "127.0.0.1:0", "--model-file", str(gguf)],
                    "embedded model listening on ", tmp_path / f"m{i}.stderr") for i in range(2)]
    try:
        urls = [p.url for p in procs]
        proxy = make_proxy(toml=pool_toml(urls, extra='kind = "vllm"'))
        # The ring's split follows the replicas' random ports: with 6
        # rollouts, all of them landed on one replica about once in 32 runs;
        # with 16, once in 32,768.
        rollouts = [f"emb-{i}" for i in range(16)]

        def turn(r: str, t: int) -> None:
            body = {"model": "smol", "max_tokens": 4, "temperature": 0, "stream": t % 2 == 1,
                    "messages": [{"role": "user", "content": f"{r}: say a number ({t})"}]}
            resp = h.post_json(proxy.url, f"/rollouts/{r}/v1/chat/completions", body, timeout=300)
            assert resp.status == 200, (r, t, resp.body)

        for t in range(2):
            for r in rollouts:
                turn(r, t)
        h.wait_for_shards(proxy.url)
        before = h.duck_dicts(proxy.shards, "SELECT rollout_id, replica, token_capture FROM t")
        home = defaultdict(set)
        for row in before:
            home[row["rollout_id"]].add(row["replica"])
        assert all(len(v) == 1 for v in home.values()), home
        assert len({next(iter(v)) for v in home.values()}) == 2, "both replicas serve rollouts"
        assert all(row["token_capture"] == "ids_and_logprobs" for row in before), before

        dead = f"{urls[0]}/v1"
        procs[0].kill()
        for r in rollouts:
            turn(r, 2)
        h.wait_for_shards(proxy.url)
        after = h.duck_dicts(proxy.shards, "SELECT rollout_id, status, replica, repinned FROM t WHERE sequence = 2")
        assert len(after) == len(rollouts) and all(row["status"] == "ok" for row in after), after
        assert all(row["replica"] == f"{urls[1]}/v1" for row in after)
        assert {row["rollout_id"] for row in after if row["repinned"]} == \
            {r for r, v in home.items() if v == {dead}}
    finally:
        for p in procs:
            p.kill()
