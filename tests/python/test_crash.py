"""SIGKILL under load, restart on the same shards directory, and check the
durability contract: every call whose response a client received completely
is in the shards exactly once with status ok; calls cut off by the crash are
`incomplete`/`interrupted`; nothing is duplicated, by replay or by a second
crash-and-restart."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

import rollcall_harness as h

THREADS = 8
STREAM_MODEL = "scripted@events=6@delay_ms=8"
# Streams so slow that some are always in flight when the kill comes: the
# test requires calls cut off by it, as `incomplete` rows.
SLOW_THREADS = 2
SLOW_MODEL = "scripted@events=50@delay_ms=100"


@dataclass
class Attempt:
    rollout: str
    n: int  # the call's position in its rollout (its thread's n-th call)
    content: str
    kind: str  # chat | chat_stream | responses_stream
    acked: bool = False


def kind_of(n: int, k: int = 0) -> str:
    if k >= THREADS:
        return "slow_stream"
    return ("chat", "chat_stream", "chat", "responses_stream")[n % 4]


def request_for(kind: str, q: str) -> tuple[str, bytes]:
    if kind == "responses_stream":
        return "responses", json.dumps({"model": STREAM_MODEL, "input": q, "stream": True}).encode()
    stream = kind in ("chat_stream", "slow_stream")
    model = SLOW_MODEL if kind == "slow_stream" else STREAM_MODEL if stream else "scripted"
    body = {"model": model, "messages": [{"role": "user", "content": q}], "stream": stream}
    return "chat/completions", json.dumps(body).encode()


def acknowledged(kind: str, q: str, status: int, body: bytes, error: BaseException | None) -> bool:
    """The client has the whole response: the full JSON body, or the whole
    stream through its terminal event."""
    if error is not None or status != 200:
        return False
    if kind == "chat":
        return json.loads(body)["choices"][0]["message"]["content"] == f"Reply to: {q}"
    events = h.sse_events(body)
    if not body.endswith(b"\n\n") or not events:
        return False
    if kind in ("chat_stream", "slow_stream"):
        text = "".join(
            c["delta"].get("content") or "" for _, d in events if d != "[DONE]" for c in json.loads(d)["choices"]
        )
        return events[-1][1] == "[DONE]" and text == f"Reply to: {q}"
    last = json.loads(events[-1][1])
    return last["type"] == "response.completed" and last["response"]["output"][0]["content"][0]["text"] == (
        f"Reply to: {q}"
    )


def client_thread(base: str, tag: str, k: int, stop: threading.Event, out: list[Attempt]) -> None:
    u = urlsplit(base)
    rollout = f"crash-{tag}-t{k}"
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    n = 0
    while not stop.is_set():
        q = f"crash-{tag}-{k}-{n}"
        a = Attempt(rollout, n, q, kind_of(n, k))
        out.append(a)
        path, body = request_for(a.kind, q)
        try:
            conn.request("POST", f"/rollouts/{rollout}/v1/{path}", body=body,
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            got, err = bytearray(), None
            try:
                while chunk := r.read1(65536):
                    got += chunk
            except (http.client.HTTPException, OSError) as e:
                err = e
            r.close()  # (read1 does not mark a fully read response done; the connection is kept)
            a.acked = acknowledged(a.kind, q, r.status, bytes(got), err)
            if err is not None:
                return
        except (http.client.HTTPException, OSError):
            return  # the proxy is gone
        n += 1


def load_then_kill(p: h.Proxy, tag: str, seconds: float) -> list[Attempt]:
    stop = threading.Event()
    outs: list[list[Attempt]] = [[] for _ in range(THREADS + SLOW_THREADS)]
    threads = [
        threading.Thread(target=client_thread, args=(p.url, tag, k, stop, outs[k]), daemon=True)
        for k in range(THREADS + SLOW_THREADS)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)
    p.kill()  # SIGKILL while calls are in flight
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    attempts = [a for o in outs for a in o]
    assert sum(a.acked for a in attempts) >= THREADS, "the load did not get going before the kill"
    return attempts


def check_durability(shards, attempts: list[Attempt]) -> list[dict]:
    rows = h.read_calls_arrow(shards)
    # DuckDB sees the same rows
    assert h.duck(shards, "SELECT count(*), count(DISTINCT call_id) FROM t") == [(len(rows), len(rows))]
    ids = Counter(r["call_id"] for r in rows)
    assert all(c == 1 for c in ids.values()), [i for i, c in ids.items() if c > 1]

    by_content = {a.content: a for a in attempts}
    seen: Counter = Counter()
    for r in rows:
        q = h.last_user_text(json.loads(r["request"]))
        assert q in by_content, f"row for a call never made: {q!r}"
        a = by_content[q]
        seen[q] += 1
        assert r["rollout_id"] == a.rollout
        assert r["sequence"] == a.n, (q, r["sequence"])  # arrival order within the rollout
        assert r["stream"] is (a.kind != "chat")
        if r["status"] == "ok":
            # complete (the client may have lost the last bytes to the kill)
            assert r["http_status"] == 200 and r["failure_class"] is None
            assert json.loads(r["response_message"])["content"] == f"Reply to: {q}"
        elif r["status"] == "incomplete":
            assert r["failure_class"] == "interrupted", (q, r["failure_class"])
            assert not a.acked, f"acknowledged call {q} recorded as incomplete"
        else:
            assert (r["status"], r["failure_class"]) == ("failed", "client_disconnected"), (
                q, r["status"], r["failure_class"], r["failure_message"])
            assert not a.acked
    assert all(c == 1 for c in seen.values()), [q for q, c in seen.items() if c > 1]

    # The slow streams were in flight at the kill: their calls are incomplete.
    assert any(r["status"] == "incomplete" for r in rows), "the kill cut off no call"

    acked = [a for a in attempts if a.acked]
    rows_by_q = {h.last_user_text(json.loads(r["request"])): r for r in rows}
    lost = [a.content for a in acked if a.content not in rows_by_q]
    assert not lost, f"{len(lost)} acknowledged calls missing from the shards, e.g. {lost[:5]}"
    not_ok = [(a.content, rows_by_q[a.content]["status"]) for a in acked if rows_by_q[a.content]["status"] != "ok"]
    assert not not_ok, not_ok

    seqs = Counter((r["rollout_id"], r["sequence"]) for r in rows)
    assert all(c == 1 for c in seqs.values())
    return rows


def crash_toml(upstream: str, max_age: float) -> str:
    return f"""
[server]
shutdown_grace_secs = 5
[shards]
max_age_secs = {max_age}
[[routes]]
name = "default"
url = "{upstream}/v1"
response_timeout_secs = 10.0
idle_timeout_secs = 10.0
"""


def test_sigkill_under_load_then_restart(make_proxy, upstream, tmp_path):
    shards = tmp_path / "crash-shards"
    toml = crash_toml(upstream, 0.2)  # some rows already published at the kill, some only in the WAL
    p1 = make_proxy(toml, shards=shards, name="p1")
    attempts = load_then_kill(p1, "a", 1.5)

    p2 = make_proxy(toml, shards=shards, name="p2")
    # numbering continues after the replayed calls: one more call per rollout
    after = []
    for k in range(THREADS):
        a = Attempt(f"crash-a-t{k}", -1, f"after-restart-{k}", "chat")
        r = h.post_json(p2.url, f"/rollouts/{a.rollout}/v1/chat/completions",
                        {"model": "scripted", "messages": [{"role": "user", "content": a.content}]})
        assert r.status == 200
        a.acked = acknowledged(a.kind, a.content, r.status, r.body, r.error)
        after.append(a)
    assert p2.terminate() == 0
    assert list((shards / ".tmp").glob("*")) == []
    assert list((shards / "wal").glob("*.log")) == []  # everything replayed and published

    rows = h.read_calls_arrow(shards)
    first_run = {a.content for a in attempts}
    for a in after:
        (late,) = [r for r in rows if h.last_user_text(json.loads(r["request"])) == a.content]
        earlier = [r["sequence"] for r in rows
                   if r["rollout_id"] == a.rollout and h.last_user_text(json.loads(r["request"])) in first_run]
        assert late["status"] == "ok"
        assert late["sequence"] > max(earlier, default=-1), (a.rollout, late["sequence"], earlier)
        a.n = late["sequence"]
    check_durability(shards, attempts + after)


def test_double_crash_replay_is_idempotent(make_proxy, upstream, tmp_path):
    shards = tmp_path / "crash2-shards"
    toml = crash_toml(upstream, 60.0)  # nothing published before the kill: everything comes from the WAL
    p1 = make_proxy(toml, shards=shards, name="p1")
    attempts = load_then_kill(p1, "b", 1.0)
    assert h.shard_files(shards) == []

    p2 = make_proxy(toml, shards=shards, name="p2")  # replays the WAL before it is ready
    rows_a = check_durability(shards, attempts)
    ids_a = sorted(r["call_id"] for r in rows_a)
    assert len(ids_a) >= sum(a.acked for a in attempts)
    p2.kill()  # crash again, right after the replay

    p3 = make_proxy(toml, shards=shards, name="p3")
    ids_b = sorted(r["call_id"] for r in h.read_calls_arrow(shards))
    assert ids_b == ids_a, "the second restart changed the rows"
    assert p3.terminate() == 0

    rows_c = check_durability(shards, attempts)
    assert sorted(r["call_id"] for r in rows_c) == ids_a
    assert h.duck(shards, "SELECT count(*) FROM t") == [(len(ids_a),)]
    assert list((shards / "wal").glob("*.log")) == []
