"""Faults: upstream errors, timeouts, dropped and broken streams, client
disconnects, bad requests, untagged calls, bad finish bodies; and no API key
ever reaching the shards or the logs."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import openai
import pyarrow.parquet as pq
import pytest

import rollcall_harness as h

SECRET = "sk-secret-XYZ"


def fault_toml(upstream: str, max_body: int = 1 << 20, untagged: str = "default") -> str:
    return f"""
[server]
max_body_bytes = {max_body}
shutdown_grace_secs = 5
[rollouts]
untagged = "{untagged}"
[shards]
max_age_secs = 0.2
max_rows = 100000
[[routes]]
name = "default"
url = "{upstream}/v1"
response_timeout_secs = 1.0
idle_timeout_secs = 1.0
"""


@pytest.fixture
def fproxy(make_proxy, upstream):
    return make_proxy(fault_toml(upstream))


def rows_of(p: h.Proxy, rollout: str, n: int | None = None, timeout: float = 20.0) -> list[dict]:
    """The rollout's rows once published (waiting for `n` of them when given,
    since a call still in flight is not yet counted in shard_lag_rows)."""
    deadline = time.monotonic() + timeout
    while True:
        h.wait_for_shards(p.url)
        rows = sorted(
            (r for r in h.read_calls_arrow(p.shards) if r["rollout_id"] == rollout), key=lambda r: r["sequence"]
        )
        if n is None or len(rows) >= n or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if n is not None:
        assert len(rows) == n, [(r["status"], r["failure_class"]) for r in rows]
    assert [r["sequence"] for r in rows] == list(range(len(rows)))
    return rows


def assert_openai_error(body: bytes, code: str | None = None, kind: str | None = None) -> dict:
    err = json.loads(body)["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    if kind is not None:
        assert err["type"] == kind, err
    return err


def chat_body(model: str, text: str, stream: bool = False) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}).encode()


# --------------------------------------------------------- upstream status


def test_upstream_error_statuses(fproxy):
    rid = "faults-status"
    tee = h.TeeTransport()
    client = h.sdk_client(f"{fproxy.url}/rollouts/{rid}/v1", tee=tee)
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.InternalServerError) as e500:
        client.chat.completions.create(model="x@fault=500", messages=msgs)
    assert e500.value.status_code == 500
    with pytest.raises(openai.RateLimitError) as e429:
        client.chat.completions.create(model="x@fault=429", messages=msgs)
    assert e429.value.status_code == 429
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="x@fault=400", input="x")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="x@fault=500", messages=msgs, stream=True)

    rows = rows_of(fproxy, rid, 4)
    expect = [
        (500, "upstream_server_error", False, "chat_completions"),
        (429, "upstream_client_error", False, "chat_completions"),
        (400, "upstream_client_error", False, "responses"),
        (500, "upstream_server_error", True, "chat_completions"),
    ]
    for row, ex, (status, cls, stream, api) in zip(rows, tee.exchanges, expect):
        assert row["status"] == "failed"
        assert (row["http_status"], row["failure_class"], row["stream"], row["wire_api"]) == (status, cls, stream, api)
        assert ex["status"] == status
        assert row["failure_message"]
        assert row["request"].encode() == ex["request"]
        assert row["response_raw"] == bytes(ex["response"])
        assert_openai_error(row["response_raw"])
        assert row["response_message"] is None and row["tool_calls"] is None

    m = h.metrics_text(fproxy.url)
    assert 'rollcall_call_failures_total{class="upstream_server_error"} 2' in m
    assert 'rollcall_call_failures_total{class="upstream_client_error"} 2' in m
    assert 'rollcall_calls_total{wire_api="chat_completions",status="failed"} 3' in m


def test_upstream_timeout(fproxy):
    rid = "faults-timeout"
    client = h.sdk_client(f"{fproxy.url}/rollouts/{rid}/v1")
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="x@fault=timeout", messages=[{"role": "user", "content": "wait"}])
    assert e.value.status_code == 504
    assert_openai_error(e.value.response.content, code="upstream_timeout", kind="server_error")

    # the same with a raw client, streaming requested
    r = h.raw_request(fproxy.url, "POST", f"/rollouts/{rid}/v1/chat/completions", chat_body("x@fault=timeout", "w", True))
    assert r.status == 504
    assert_openai_error(r.body, code="upstream_timeout")

    rows = rows_of(fproxy, rid, 2)
    for row in rows:
        assert (row["status"], row["failure_class"], row["http_status"]) == ("failed", "upstream_timeout", 504)
    assert rows[1]["response_raw"] == r.body


# --------------------------------------------------------- broken streams


def test_stream_dropped_midway(fproxy):
    rid = "faults-drop"
    model = "x@fault=drop@events=8@delay_ms=20"
    # raw, chat: the deltas so far, an error event in the chat format, then an aborted body
    r = h.raw_request(fproxy.url, "POST", f"/rollouts/{rid}/v1/chat/completions", chat_body(model, "raw", True))
    # raw, responses: an `event: error`, then an aborted body
    rb = json.dumps({"model": model, "input": "resp", "stream": True}).encode()
    r2 = h.raw_request(fproxy.url, "POST", f"/rollouts/{rid}/v1/responses", rb)
    # not streaming: 502 in OpenAI format
    r3 = h.raw_request(fproxy.url, "POST", f"/rollouts/{rid}/v1/chat/completions", chat_body("x@fault=drop", "whole"))
    # the SDK, streaming: raises on the error event
    client = h.sdk_client(f"{fproxy.url}/rollouts/{rid}/v1")
    got, sdk_error = "", None
    try:
        for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "dropme"}], stream=True
        ):
            for ch in chunk.choices:
                got += ch.delta.content or ""
    except Exception as e:  # checked below
        sdk_error = e

    rows = rows_of(fproxy, rid, 4)
    for row in rows:
        assert (row["status"], row["failure_class"]) == ("failed", "upstream_dropped"), row["failure_message"]
        assert row["failure_message"]
    assert [r["http_status"] for r in rows] == [200, 200, 502, 200]
    assert [r["stream"] for r in rows] == [True, True, False, True]
    assert r3.status == 502
    assert_openai_error(r3.body, code="upstream_dropped", kind="server_error")
    assert rows[2]["response_raw"] == r3.body

    # the recorded stream ends in the error event
    rec = h.sse_events(rows[0]["response_raw"])
    assert json.loads(rec[-1][1])["error"]["code"] == "upstream_dropped"
    rec2 = h.sse_events(rows[1]["response_raw"])
    assert rec2[-1][0] == "error" and json.loads(rec2[-1][1])["code"] == "upstream_dropped"

    # what the clients got
    assert r.status == 200 and r2.status == 200
    assert r.error is not None and r2.error is not None, "the body must be aborted, not ended cleanly"
    assert b"[DONE]" not in r.body and b"response.completed" not in r2.body
    events = h.sse_events(r.body)
    assert events and "error" in json.loads(events[-1][1]), (
        f"chat client did not receive the SSE error event; its body ends with {r.body[-150:]!r}"
    )
    assert json.loads(events[-1][1])["error"]["code"] == "upstream_dropped"
    last = h.sse_events(r2.body)[-1]
    assert last[0] == "error", f"responses client did not receive `event: error`; body ends {r2.body[-150:]!r}"
    assert json.loads(last[1])["code"] == "upstream_dropped"
    # response_raw is exactly what the client received
    assert rows[0]["response_raw"] == r.body
    assert rows[1]["response_raw"] == r2.body
    # the SDK saw the error event as an APIError
    assert isinstance(sdk_error, openai.APIError), repr(sdk_error)
    assert "Reply to: dropme".startswith(got) and got != "Reply to: dropme"
    assert json.loads(rows[3]["response_message"])["content"] == got


def test_stream_error_event(fproxy):
    rid = "faults-stream-error"
    client = h.sdk_client(f"{fproxy.url}/rollouts/{rid}/v1")
    with pytest.raises(openai.APIError) as e:
        for _ in client.chat.completions.create(
            model="x@fault=stream_error", messages=[{"role": "user", "content": "err"}], stream=True
        ):
            pass
    assert "scripted stream error" in str(e.value)

    r = h.raw_request(
        fproxy.url, "POST", f"/rollouts/{rid}/v1/chat/completions", chat_body("x@fault=stream_error", "raw", True)
    )
    assert r.status == 200
    events = h.sse_events(r.body)
    assert "error" in json.loads(events[-1][1])
    assert all(ev[1] != "[DONE]" for ev in events)

    rows = rows_of(fproxy, rid, 2)
    assert rows[1]["response_raw"] == r.body
    for row in rows:
        assert row["status"] == "failed", (row["status"], row["failure_class"], row["failure_message"])
        assert row["failure_class"] == "upstream_stream_error"
        assert "scripted stream error" in row["failure_message"]


def test_client_disconnect_mid_stream(fproxy):
    rid = "faults-disconnect"
    u = urlsplit(fproxy.url)
    body = chat_body("x@events=50@delay_ms=50", "slow", True)
    head = (
        f"POST /rollouts/{rid}/v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    s.sendall(head + body)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        assert chunk, "connection closed before the first chunk"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200")
    s.close()

    rows = rows_of(fproxy, rid, 1)
    row = rows[0]
    assert (row["status"], row["failure_class"]) == ("failed", "client_disconnected"), row["failure_message"]
    assert row["stream"] is True
    assert row["response_raw"] and row["response_raw"].startswith(b"data: ")
    assert b"[DONE]" not in row["response_raw"]


# --------------------------------------------------------- bad requests


def test_malformed_json(fproxy):
    rid = "faults-bad-json"
    bad = b'{"model": "scripted", "messages": [{"role": "user", "content": "unterminated'
    r = h.raw_request(fproxy.url, "POST", f"/rollouts/{rid}/v1/chat/completions", bad)
    assert r.status == 400
    assert_openai_error(r.body, kind="invalid_request_error")
    not_obj = b"[1, 2, 3]"
    r2 = h.raw_request(fproxy.url, "POST", f"/rollouts/{rid}/v1/responses", not_obj)
    assert r2.status == 400
    assert_openai_error(r2.body, kind="invalid_request_error")

    rows = rows_of(fproxy, rid, 2)
    for row, body, resp in zip(rows, (bad, not_obj), (r, r2)):
        assert (row["status"], row["failure_class"], row["http_status"]) == ("failed", "bad_request", 400)
        assert row["request"].encode() == body
        assert row["response_raw"] == resp.body


def test_oversized_body(make_proxy, upstream):
    p = make_proxy(fault_toml(upstream, max_body=2048))
    rid = "faults-big"
    big = chat_body("scripted", "y" * 8000)
    r = h.raw_request(p.url, "POST", f"/rollouts/{rid}/v1/chat/completions", big)
    assert r.status == 413
    assert_openai_error(r.body, code="body_too_large", kind="invalid_request_error")
    # a body under the limit still works on the same proxy
    ok = h.raw_request(p.url, "POST", f"/rollouts/{rid}/v1/chat/completions", chat_body("scripted", "small"))
    assert ok.status == 200

    rows = rows_of(p, rid, 2)
    assert (rows[0]["status"], rows[0]["failure_class"], rows[0]["http_status"]) == ("failed", "body_too_large", 413)
    assert rows[1]["status"] == "ok"


def test_unknown_paths(fproxy):
    for method, path in [
        ("POST", "/v1/embeddings"),
        ("POST", "/rollouts/r1/v1/audio/speech"),
        ("GET", "/v2/models"),
        ("GET", "/nothing/here"),
    ]:
        r = h.raw_request(fproxy.url, method, path, b"{}" if method == "POST" else None)
        assert r.status == 404, (path, r.status)
        assert r.headers["content-type"].startswith("application/json")
        assert_openai_error(r.body, kind="invalid_request_error")
    h.wait_for_shards(fproxy.url)
    assert h.read_calls_arrow(fproxy.shards) == []


def test_untagged_rejected(make_proxy, upstream):
    p = make_proxy(fault_toml(upstream, untagged="reject"))
    client = h.sdk_client(f"{p.url}/v1")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "who am i"}])
    assert e.value.status_code == 400
    assert_openai_error(e.value.response.content, kind="invalid_request_error")
    # tagged calls still work
    tagged = h.sdk_client(f"{p.url}/rollouts/tagged-1/v1")
    tagged.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "ok"}])
    h.wait_for_shards(p.url)
    rows = h.read_calls_arrow(p.shards)
    assert [(r["rollout_id"], r["status"]) for r in rows] == [("tagged-1", "ok")]


def test_untagged_recorded_under_default_rollout(fproxy):
    client = h.sdk_client(f"{fproxy.url}/v1")
    c = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "anon 1"}])
    assert c.choices[0].message.content == "Reply to: anon 1"
    client.completions.create(model="scripted", prompt="anon 2")
    rows = rows_of(fproxy, "untagged", 2)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [r["wire_api"] for r in rows] == ["chat_completions", "completions"]


def test_finish_bad_bodies(fproxy):
    for body in [
        b"not json",
        b"{}",
        b'{"reward": 1.0}',
        b'{"status": 5}',
        b'{"status": "ok", "reward": "high"}',
        b'{"status": "ok", "unknown_field": 1}',
    ]:
        r = h.raw_request(fproxy.url, "POST", "/v1/rollouts/fin-bad/finish", body)
        assert r.status == 400, (body, r.status, r.body)
        assert_openai_error(r.body, kind="invalid_request_error")
    r = h.raw_request(fproxy.url, "POST", "/v1/rollouts/bad id!/finish".replace(" ", "%20"), b'{"status": "ok"}')
    assert r.status == 400
    h.wait_for_shards(fproxy.url)
    assert h.read_rollouts_arrow(fproxy.shards) == []


# --------------------------------------------------------- secrets


def test_api_key_never_written(make_proxy, upstream):
    p = make_proxy(fault_toml(upstream, max_body=4096), env={"ROLLCALL_LOG": "debug"})
    rid = "secret-rollout"
    client = h.sdk_client(f"{p.url}/rollouts/{rid}/v1", api_key=SECRET)
    client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "a"}])
    for _ in client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "b"}], stream=True
    ):
        pass
    client.responses.create(model="scripted", input="c")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="x@fault=500", messages=[{"role": "user", "content": "d"}])
    with pytest.raises((openai.APIError, httpx.HTTPError)):  # the error itself is test_stream_dropped_midway's
        for _ in client.chat.completions.create(
            model="x@fault=drop", messages=[{"role": "user", "content": "e"}], stream=True
        ):
            pass
    auth = {"Authorization": f"Bearer {SECRET}", "x-api-key": SECRET}
    h.raw_request(p.url, "POST", f"/rollouts/{rid}/v1/chat/completions", b"{broken", auth)
    h.raw_request(p.url, "POST", f"/rollouts/{rid}/v1/chat/completions", chat_body("s", "z" * 5000), auth)
    h.raw_request(p.url, "POST", "/v1/chat/completions", chat_body("s", "hdr"), {**auth, "X-Rollout-Id": "s2"})
    h.raw_request(p.url, "POST", f"/v1/rollouts/{rid}/finish", b'{"status": "done"}', auth)
    h.raw_request(p.url, "GET", f"/rollouts/{rid}/v1/models", None, auth)
    assert p.terminate() == 0

    tables = [pq.read_table(f) for kind in ("calls", "rollouts") for f in h.shard_files(p.shards, kind)]
    assert sum(t.num_rows for t in tables) >= 9
    for t in tables:
        for name in t.column_names:
            for v in t.column(name).to_pylist():
                text = v if isinstance(v, str) else (v.decode("utf-8", "replace") if isinstance(v, bytes) else repr(v))
                assert SECRET not in text, f"API key found in shard column {name}"
    for f in p.shards.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f"API key found in {f.name}"
    log = p.stderr_text()
    assert "secret-rollout" in log or "shutting down" in log  # the log was captured
    assert SECRET not in log, "API key found in the proxy's log"


def test_query_string_key_never_written(make_proxy, upstream, tmp_path):
    """A key in the query string, with the upstream unreachable, reached the
    row's failure_message and the log through the HTTP client's error text
    (which carries the full URL)."""
    toml = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "gone"
url = "http://user:route-password-77@127.0.0.1:9/v1"
connect_retries = 0
"""
    p = make_proxy(toml, env={"ROLLCALL_LOG": "debug"})
    key = "sk-querykey-0123456789abcdef"
    for path in (f"/rollouts/q/v1/chat/completions?api-key={key}&beta=true",
                 f"/rollouts/q/v1/responses?key={key}",
                 f"/rollouts/q/v1/messages?beta=true&token={key}"):
        r = h.raw_request(p.url, "POST", path, chat_body("m", "q"), {})
        assert r.status == 502, (path, r.status, r.body[:200])
        assert key.encode() not in r.body and b"route-password-77" not in r.body, r.body
    rows = rows_of(p, "q", 3)
    assert {r["failure_class"] for r in rows} == {"upstream_connect"}
    assert p.terminate() == 0
    for f in p.shards.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert key.encode() not in data and b"route-password-77" not in data, f.name
    log = p.stderr_text()
    assert "upstream" in log  # the failures were logged
    assert key not in log and "route-password-77" not in log, "a secret reached the log"
