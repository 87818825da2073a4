"""Replay each harness's captured exchange (fixtures/<name>/exchange.jsonl)
through a real proxy, without running the harness.

The upstream here is a replay server (a real HTTP server on loopback, the
stand-in for a model server): it answers each call with the recorded
response bytes, streamed event by event, and keeps what the proxy sent it.
The test checks that the proxy forwards each request byte for byte, returns
each response byte for byte, and records both faithfully (shards read back
with pyarrow and DuckDB).
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

import rollcall_harness as h

FIXTURES = h.REPO_ROOT / "fixtures"
NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/exchange.jsonl"))


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name / "exchange.jsonl").read_text().splitlines() if line]


class Replay:
    """Serves the recorded responses in order; keeps the requests it got."""

    def __init__(self, exchanges: list[dict]):
        self.exchanges = exchanges
        self.received: list[tuple[str, bytes]] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                i = len(replay.received)
                replay.received.append((self.path, body))
                e = replay.exchanges[i]
                data = e["response"].encode()
                self.send_response(e["status"])
                self.send_header("Content-Type", e["content_type"])
                if e["stream"]:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    pos = 0
                    while pos < len(data):  # one HTTP chunk per SSE event
                        end = data.find(b"\n\n", pos)
                        end = len(data) if end < 0 else end + 2
                        chunk, pos = data[pos:end], end
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


def test_fixtures_exist_for_every_harness():
    assert set(NAMES) >= {"codex", "openclaw", "zeroclaw", "mini-swe-agent", "opencode", "claude-code"}, NAMES



def send(proxy_url: str, rollout: str, e: dict) -> tuple[int, bytes]:
    """Send one captured request through the proxy as rollout `rollout`, with
    the harness's user agent; returns the status and the body it got."""
    u = urlparse(proxy_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-replay"}
    if e["user_agent"]:
        headers["User-Agent"] = e["user_agent"]
    try:
        conn.request("POST", f"/rollouts/{rollout}{e['path']}", body=e["request"].encode(), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("name", NAMES)
def test_replay_fixture(name, tmp_path):
    exchanges = load(name)
    replay = Replay(exchanges)
    try:
        proxy = h.start_proxy(tmp_path / "p", replay.url, toml=h.TWO_ROUTES_TOML.format(upstream=replay.url))
        rollout = f"replay-{name}"
        for e in exchanges:
            status, body = send(proxy.url, rollout, e)
            assert status == e["status"]
            assert body == e["response"].encode(), "the harness gets the response byte for byte"
        # The upstream saw every request exactly as the harness sent it.
        assert [p for p, _ in replay.received] == [e["path"] for e in exchanges]
        assert [b for _, b in replay.received] == [e["request"].encode() for e in exchanges]

        h.wait_for_shards(proxy.url)
        rows = h.rows_by_rollout(h.read_calls_arrow(proxy.shards))[rollout]
        assert len(rows) == len(exchanges)
        for r, e in zip(rows, exchanges):
            assert r["request"] == e["request"]
            assert r["response_raw"] == e["response"].encode()
            assert r["status"] == "ok" and r["stream"] == e["stream"]
            assert r["user_agent"] == e["user_agent"]
        # The assembled tool calls match what the recorded responses carry.
        expected_tools = [tool_names(e) for e in exchanges]
        got_tools = [[c["function"]["name"] for c in json.loads(r["tool_calls"] or "[]")] for r in rows]
        assert got_tools == expected_tools
        assert any(expected_tools), "each fixture holds a tool call"
        # DuckDB agrees on the rollout's shape.
        n, = h.duck(proxy.shards, f"SELECT count(*) FROM t WHERE rollout_id = '{rollout}'")[0]
        assert n == len(exchanges)
        proxy.kill()
    finally:
        replay.close()


def tool_names(e: dict) -> list[str]:
    """Tool-call names in a recorded response, parsed independently of rollcall."""
    if not e["stream"]:
        body = json.loads(e["response"])
        if "choices" in body:
            return [c["function"]["name"] for c in body["choices"][0]["message"].get("tool_calls") or []]
        if body.get("type") == "message":
            return [b["name"] for b in body["content"] if b["type"] == "tool_use"]
        return [o["name"] for o in body.get("output", []) if o.get("type") == "function_call"]
    names = []
    for _, data in h.sse_events(e["response"].encode()):
        if data == "[DONE]" or not data:
            continue
        ev = json.loads(data)
        for ch in ev.get("choices", []):
            for tc in ch.get("delta", {}).get("tool_calls") or []:
                if tc.get("function", {}).get("name"):
                    names.append(tc["function"]["name"])
        if ev.get("type") == "response.output_item.added" and ev["item"].get("type") == "function_call":
            names.append(ev["item"]["name"])
        if ev.get("type") == "content_block_start" and ev["content_block"].get("type") == "tool_use":
            names.append(ev["content_block"]["name"])
    return names
