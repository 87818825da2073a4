"""Weight sync on loopback: `POST /v1/admin/pause` (hold or abort) and
`/v1/admin/resume` with a policy version, against the scripted model
server. Every harness call completes; the rows say which policy version
each call ran under and whether it spanned an update."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pyarrow.parquet as pq

import rollcall_harness as h

ADMIN = "admin-secret"
CLIENT = "client-secret"


def toml(max_wait: float = 60.0) -> str:
    return f"""
[server]
admin_keys_env = "TEST_ADMIN_KEYS"
client_keys_env = "TEST_CLIENT_KEYS"
pause_max_wait_secs = {max_wait}
[shards]
max_age_secs = 0.2
max_rows = 100000
"""


def proxy_with_keys(make_proxy, max_wait: float = 60.0):
    return make_proxy(toml=toml(max_wait), env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": CLIENT})


def admin(base: str, method: str, path: str, body: dict | None = None, key: str = ADMIN) -> h.RawResponse:
    headers = {"Authorization": f"Bearer {key}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    return h.raw_request(base, method, path, json.dumps(body).encode() if body is not None else None, headers)


def chat(base: str, rollout: str, text: str, stream: bool = False, model: str = "m") -> h.RawResponse:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    return h.post_json(base, f"/rollouts/{rollout}/v1/chat/completions", body,
                       headers={"Authorization": f"Bearer {CLIENT}"}, timeout=60)


def in_thread(fn, *args):
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn(*args)))
    t.start()
    return t, out


def rows(proxy) -> list[dict]:
    h.wait_for_shards(proxy.url)
    return h.duck_dicts(proxy.shards, "SELECT rollout_id, status, http_status, policy_version, policy_version_end, "
                                      "spanned_update, resent FROM t ORDER BY rollout_id")


def wait_held(base: str, n: int) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        st = admin(base, "GET", "/v1/admin/status").json()
        if sum(r["held_calls"] for r in st["routes"].values()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} calls were never held: {st}")


def test_admin_takes_admin_keys_only(make_proxy):
    p = proxy_with_keys(make_proxy)
    assert admin(p.url, "GET", "/v1/admin/status").status == 200
    assert admin(p.url, "GET", "/v1/admin/status", key=CLIENT).status == 401
    assert admin(p.url, "POST", "/v1/admin/pause", {"mode": "sideways"}).status == 400
    assert admin(p.url, "POST", "/v1/admin/pause", {"mode": "hold", "route": "nope"}).status == 404
    # No admin keys configured: refused outright.
    plain = make_proxy(name="plain")
    r = admin(plain.url, "POST", "/v1/admin/pause", {"mode": "hold"})
    assert r.status == 403 and "admin_keys_env" in r.body.decode()


def test_hold_waits_and_every_call_completes_with_its_version(make_proxy):
    p = proxy_with_keys(make_proxy)
    # A call in flight when the pause begins finishes; it spans the update.
    early, early_out = in_thread(chat, p.url, "early", "slow one", False, "m@ttfb_ms=1500")
    time.sleep(0.3)
    assert admin(p.url, "POST", "/v1/admin/pause", {"mode": "hold"}).json()["routes"]
    held = [in_thread(chat, p.url, f"held-{i}", f"call {i}", i % 2 == 1) for i in range(4)]
    wait_held(p.url, 4)
    assert all(t.is_alive() for t, _ in held)
    st = admin(p.url, "POST", "/v1/admin/resume", {"policy_version": 3}).json()
    assert all(r["paused"] is None and r["policy_version"] == 3 for r in st["routes"].values())
    for t, out in held + [(early, early_out)]:
        t.join(30)
        assert out["r"].status == 200, out["r"].body
    by = {r["rollout_id"]: r for r in rows(p)}
    assert (by["early"]["policy_version"], by["early"]["policy_version_end"], by["early"]["spanned_update"]) == (0, 3, True)
    for i in range(4):
        r = by[f"held-{i}"]
        assert (r["status"], r["policy_version"], r["policy_version_end"], r["spanned_update"], r["resent"]) == \
            ("ok", 3, 3, False, 0), r


def test_abort_cuts_and_resends_without_the_harness_seeing_an_error(make_proxy):
    p = proxy_with_keys(make_proxy)
    slow, out = in_thread(chat, p.url, "cut", "slow one", False, "m@ttfb_ms=1500")
    time.sleep(0.3)
    admin(p.url, "POST", "/v1/admin/pause", {"mode": "abort"})
    time.sleep(0.5)
    assert slow.is_alive()
    admin(p.url, "POST", "/v1/admin/resume", {"policy_version": 5})
    slow.join(30)
    assert out["r"].status == 200, out["r"].body
    assert "Reply to: slow one" in out["r"].body.decode()
    (r,) = rows(p)
    assert (r["status"], r["policy_version"], r["policy_version_end"], r["resent"], r["spanned_update"]) == \
        ("ok", 5, 5, 1, True), r


def test_a_call_held_too_long_gets_its_own_apis_503(make_proxy):
    p = proxy_with_keys(make_proxy, max_wait=0.5)
    admin(p.url, "POST", "/v1/admin/pause", {"mode": "hold"})
    r = chat(p.url, "late", "hello")
    assert r.status == 503 and r.headers.get("retry-after") == "5"
    assert r.json()["error"]["code"] == "paused"
    m = h.post_json(p.url, "/rollouts/late-m/v1/messages",
                    {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                    headers={"x-api-key": CLIENT, "anthropic-version": "2023-06-01"})
    assert m.status == 503 and m.json()["type"] == "error" and m.json()["error"]["type"]
    admin(p.url, "POST", "/v1/admin/resume", {})
    assert chat(p.url, "late", "again").status == 200
    by = {}
    for row in rows(p):
        by.setdefault(row["rollout_id"], []).append(row)
    # The refused call is recorded (failed, overloaded) beside the one that went through.
    assert sorted(x["status"] for x in by["late"]) == ["failed", "ok"]


def test_rl_export_carries_policy_versions_and_filters_stale_samples(make_proxy, upstream, tmp_path):
    """Token-capturing route (vLLM-style ids from the scripted server): the
    RL samples say which policy version each call ran under, and
    `--max-staleness` drops the samples of an older policy."""
    cfg = toml() + f'[[routes]]\nname = "policy"\nurl = "{upstream}/v1"\nkind = "vllm"\n'
    p = make_proxy(toml=cfg, env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": CLIENT})

    def two_turns(rollout: str) -> None:
        msgs = [{"role": "user", "content": f"{rollout} first"}]
        r = h.post_json(p.url, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": msgs},
                        headers={"Authorization": f"Bearer {CLIENT}"})
        assert r.status == 200, r.body
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "second"}]
        r = h.post_json(p.url, f"/rollouts/{rollout}/v1/chat/completions", {"model": "m", "messages": msgs},
                        headers={"Authorization": f"Bearer {CLIENT}"})
        assert r.status == 200, r.body
        fin = h.post_json(p.url, f"/v1/rollouts/{rollout}/finish", {"status": "completed", "reward": 1.0},
                          headers={"Authorization": f"Bearer {CLIENT}"})
        assert fin.status == 200, fin.body

    two_turns("old")
    admin(p.url, "POST", "/v1/admin/pause", {"mode": "hold"})
    admin(p.url, "POST", "/v1/admin/resume", {"policy_version": 4})
    two_turns("new")
    h.wait_for_shards(p.url)
    out = tmp_path / "rl"
    subprocess.run([h.rollcall_bin(), "export", "rl", "--shards", str(p.shards), "--out", str(out)],
                   check=True, capture_output=True)
    t = {r["rollout_id"]: r for r in pq.read_table(out / "rl.parquet").to_pylist()}
    assert (t["old"]["policy_versions"], t["old"]["policy_version"]) == ([0, 0], 0)
    assert (t["new"]["policy_versions"], t["new"]["policy_version"]) == ([4, 4], 4)
    fresh = tmp_path / "rl-fresh"
    subprocess.run([h.rollcall_bin(), "export", "rl", "--shards", str(p.shards), "--out", str(fresh),
                    "--max-staleness", "0"], check=True, capture_output=True)
    kept = pq.read_table(fresh / "rl.parquet").to_pylist()
    assert [r["rollout_id"] for r in kept] == ["new"]
    assert json.loads((fresh / "rl_report.json").read_text())["stale"] == 1


def test_real_harnesses_through_pause_resume_cycles_export_with_policy_versions(make_proxy, upstream, tmp_path):
    """Codex and mini-swe-agent, unchanged, run their two-turn tool task
    through `rollcall run` while the trainer pauses (hold, then abort) and
    resumes the route with a new policy version every second. Both finish
    their task; every call is `ok`, and the RL export carries the version of
    each of their calls."""
    import test_harnesses as th

    names = ["codex", "mini-swe-agent"]
    for n in names:
        th.need(n)
    cfg = toml() + f'[[routes]]\nname = "policy"\nurl = "{upstream}/v1"\nkind = "vllm"\n'
    keys = ",".join([CLIENT] + [th.key_of(f"ws-{n}") for n in names])
    p = make_proxy(toml=cfg, env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": keys})
    # Slow answers (1.2 s to the head, then 8 events 150 ms apart), so that
    # the pauses land while calls wait and while they stream.
    model = "scripted@ttfb_ms=1200@delay_ms=150@events=8"
    runs = {n: th.start_run(p, n, f"ws-{n}", tmp_path / n / "work", model=model, timeout=300) for n in names}
    version, modes = 0, ["hold", "abort"]
    while any(r.poll() is None for r in runs.values()):
        time.sleep(0.6)
        mode = modes[version % 2]
        assert admin(p.url, "POST", "/v1/admin/pause", {"mode": mode}).status == 200
        time.sleep(0.6)
        version += 1
        assert admin(p.url, "POST", "/v1/admin/resume", {"policy_version": version}).status == 200
    for n, r in runs.items():
        rc, out = th.finish_run(r)
        assert rc == 0, f"{n}: {out[-3000:]}"
    assert version >= 2, "the runs spanned pause/resume cycles"

    h.wait_for_shards(p.url)
    calls = h.duck_dicts(p.shards, "SELECT rollout_id, sequence, status, policy_version, policy_version_end, "
                                   "spanned_update, resent FROM t ORDER BY rollout_id, sequence")
    assert calls and all(c["status"] == "ok" for c in calls), calls
    assert {c["rollout_id"] for c in calls} == {f"ws-{n}" for n in names}
    assert all(c["policy_version"] is not None for c in calls)
    seen = {c["policy_version"] for c in calls} | {c["policy_version_end"] for c in calls}
    assert len(seen) > 1, f"calls ran under more than one policy version: {calls}"
    out = tmp_path / "rl"
    r = subprocess.run([h.rollcall_bin(), "export", "rl", "--shards", str(p.shards), "--out", str(out),
                        "--missing-reward", "zero"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rl = {s["rollout_id"]: s for s in pq.read_table(out / "rl.parquet").to_pylist()}
    assert set(rl) == {f"ws-{n}" for n in names}
    for rid, s in rl.items():
        mine = [c["policy_version"] for c in calls if c["rollout_id"] == rid]
        assert s["policy_versions"] == mine, (rid, s["policy_versions"], mine)
        assert s["policy_version"] == min(mine)


def vllm_route(upstream: str) -> str:
    return toml() + f'[[routes]]\nname = "policy"\nurl = "{upstream}/v1"\nkind = "vllm"\n'


def test_abort_mid_stream_continues_the_harness_stream_under_the_new_weights(make_proxy, upstream):
    """A stream whose head has reached the harness is cut by an `abort`
    pause and continued after the resume (`continue_final_message`): the
    harness reads one stream, one id, the whole answer; the row is `ok` and
    token-exact, and says after how many completion tokens version 3 took
    over."""
    p = make_proxy(toml=vllm_route(upstream), env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": CLIENT})
    text = "please continue this answer across a weight update"
    # 12 events, 150 ms apart: the pause lands mid-stream.
    t, out = in_thread(chat, p.url, "cont", text, True, "m@events=12@delay_ms=150")
    time.sleep(0.7)
    assert admin(p.url, "POST", "/v1/admin/pause", {"mode": "abort"}).status == 200
    time.sleep(0.4)
    assert admin(p.url, "POST", "/v1/admin/resume", {"policy_version": 3}).status == 200
    t.join(30)
    r = out["r"]
    assert r.status == 200 and r.error is None, r
    events = [json.loads(d) for _, d in h.sse_events(r.body) if d != "[DONE]"]
    assert h.sse_events(r.body)[-1][1] == "[DONE]"
    assert len({e["id"] for e in events}) == 1, "one answer, one id"
    deltas = [c["delta"] for e in events for c in e["choices"]]
    assert sum(1 for d in deltas if "role" in d) == 1
    assert "".join(d.get("content") or "" for d in deltas) == f"Reply to: {text}"
    assert not any(c.get("token_ids") for e in events for c in e["choices"]), "capture fields stay out"

    h.wait_for_shards(p.url)
    row = h.duck_dicts(p.shards, "SELECT status, resent, policy_version, policy_version_end, spanned_update, "
                                 "continued, completion_token_ids, prompt_token_ids, completion_tokens FROM t")[0]
    assert (row["status"], row["resent"], row["policy_version"], row["policy_version_end"], row["spanned_update"]) \
        == ("ok", 1, 0, 3, True), row
    (cont,) = json.loads(row["continued"])
    answer = f"Reply to: {text}".encode()
    assert cont["policy_version"] == 3 and 0 < cont["completion_tokens"] < len(answer), cont
    assert row["completion_token_ids"] == list(answer), "the ids of both parts are the answer's"
    assert row["prompt_token_ids"] == h.scripted_prompt_ids([{"role": "user", "content": text}])
    # The RL sample says which policy sampled each token.
    fin = h.post_json(p.url, "/v1/rollouts/cont/finish", {"status": "completed", "reward": 1.0},
                      headers={"Authorization": f"Bearer {CLIENT}"})
    assert fin.status == 200
    h.wait_for_shards(p.url)
    out_dir = p.shards.parent / "rl"
    subprocess.run([h.rollcall_bin(), "export", "rl", "--shards", str(p.shards), "--out", str(out_dir)],
                   check=True, capture_output=True)
    (s,) = pq.read_table(out_dir / "rl.parquet").to_pylist()
    k = cont["completion_tokens"]
    assert s["response_ids"] == list(answer)
    assert s["token_policy_versions"] == [0] * k + [3] * (len(answer) - k)


def test_abort_mid_stream_continues_a_translated_responses_stream(make_proxy, upstream):
    """A Responses harness (Codex's API) on a vLLM route: the stream, turned
    into Responses events on the way, is cut and continued, and the harness
    gets one response with the whole text."""
    p = make_proxy(toml=vllm_route(upstream), env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": CLIENT})
    text = "a responses stream that spans an update"
    body = {"model": "m@events=12@delay_ms=150", "input": text, "stream": True}
    t, out = in_thread(lambda: h.post_json(p.url, "/rollouts/resp/v1/responses", body,
                                           headers={"Authorization": f"Bearer {CLIENT}"}, timeout=60))
    time.sleep(0.7)
    admin(p.url, "POST", "/v1/admin/pause", {"mode": "abort"})
    time.sleep(0.3)
    admin(p.url, "POST", "/v1/admin/resume", {"policy_version": 1})
    t.join(30)
    r = out["r"]
    assert r.status == 200 and r.error is None, r
    events = h.sse_events(r.body)
    kinds = [e for e, _ in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed", kinds
    done = json.loads(events[-1][1])["response"]
    said = "".join(c["text"] for o in done["output"] for c in o.get("content", []) if c.get("type") == "output_text")
    assert said == f"Reply to: {text}"
    h.wait_for_shards(p.url)
    row = h.duck_dicts(p.shards, "SELECT status, continued, policy_version_end FROM t")[0]
    assert row["status"] == "ok" and json.loads(row["continued"])[0]["policy_version"] == 1, row


def test_a_vllm_server_without_its_development_endpoints_is_a_clear_error(make_proxy, upstream, tmp_path):
    """A vllm route whose server has no `/pause`, `/resume` or
    `/collective_rpc` (vLLM without VLLM_SERVER_DEV_MODE=1; here the
    scripted server, which has none of them): `keep` and `load` are 502s
    whose answers name the endpoint and the setting, the gate is open
    again, and calls still go through. A route of another kind is refused
    `keep` before anything is sent. (tests/python/test_vllm.py runs them
    against vLLM itself.)"""
    cfg = vllm_route(upstream) + f'[[routes]]\nname = "plain"\nurl = "{upstream}/v1"\nmodels = ["plain"]\n'
    p = make_proxy(toml=cfg, env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": CLIENT})
    r = admin(p.url, "POST", "/v1/admin/pause", {"mode": "keep", "route": "policy"})
    assert r.status == 502, r.body
    (u,) = r.json()["upstream"]
    assert u["success"] is False and "/pause?mode=keep" in u["error"] and "VLLM_SERVER_DEV_MODE=1" in u["error"], u
    assert r.json()["routes"]["policy"]["paused"] is None, "the gate is open again"
    r = admin(p.url, "POST", "/v1/admin/pause", {"mode": "keep"})
    assert r.status == 400 and r.json()["error"]["code"] == "keep_unsupported" and '"plain"' in r.json()["error"]["message"]
    assert admin(p.url, "GET", "/v1/admin/status").json()["routes"]["policy"]["paused"] is None
    weights = tmp_path / "ckpt"
    weights.mkdir()
    r = admin(p.url, "POST", "/v1/admin/load", {"route": "policy", "model_path": str(weights), "policy_version": 5})
    assert r.status == 502, r.body
    v = r.json()
    assert v["routes"]["policy"]["paused"] is None and v["routes"]["policy"]["policy_version"] == 0
    assert "/pause?mode=keep" in v["upstream"][0]["error"], v
    assert chat(p.url, "after", "still served").status == 200
