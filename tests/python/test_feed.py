"""The live feed (`shards.feed = true`, `GET /v1/rollouts/feed?after=CURSOR`):
each rollout arrives once it finishes, with its calls, reward, group and
policy versions, without waiting for a shard to rotate (shards here rotate
only hourly). A consumer that restarts from its cursor gets every finished
rollout exactly once, also across a SIGKILL of the proxy (the write-ahead
log's replay feeds rows again, and the feed keeps them once)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pyarrow.ipc as ipc

import rollcall_harness as h

FEED = """
[shards]
max_age_secs = 3600
max_rows = 100000
feed = true
"""


def rollout(proxy, rid: str, turns: int, reward: float, group: str) -> None:
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"{rid} turn {t}"})
        r = h.post_json(proxy.url, f"/rollouts/{rid}/v1/chat/completions", {"model": "m", "messages": messages})
        assert r.status == 200, r.body
        messages.append(json.loads(r.body)["choices"][0]["message"])
    fin = h.post_json(proxy.url, f"/v1/rollouts/{rid}/finish",
                      {"status": "completed", "reward": reward, "metadata": {"group": group}})
    assert fin.status == 200, fin.body


class Consumer:
    """A trainer reading the feed in a thread, keeping the entries it got."""

    def __init__(self, base: str, after: int):
        u = urlsplit(base)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.conn.request("GET", f"/v1/rollouts/feed?after={after}")
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        assert self.resp.getheader("content-type") == "application/x-ndjson"
        self.entries: list[dict] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for line in self.resp:
                self.entries.append(json.loads(line))
        except (OSError, ValueError, http.client.HTTPException):
            pass

    def wait_for(self, n: int, timeout: float = 20) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.entries) < n:
            assert time.monotonic() < deadline, f"got {len(self.entries)} entries, wanted {n}"
            time.sleep(0.02)
        return self.entries

    def crash(self):
        """Go away without a word (a trainer that died)."""
        self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        self.conn.close()


def test_feed_delivers_each_finished_rollout_once_across_restarts(make_proxy, tmp_path):
    proxy = make_proxy(FEED)
    shards = proxy.shards
    c = Consumer(proxy.url, after=0)
    for i in range(3):
        rollout(proxy, f"r{i}", turns=2, reward=float(i % 2), group=f"g{i // 2}")
    got = c.wait_for(3)
    assert [e["cursor"] for e in got] == [1, 2, 3]
    assert [e["rollout_id"] for e in got] == ["r0", "r1", "r2"]
    e = got[1]
    assert (e["status"], e["reward"], e["group"]) == ("completed", 1.0, "g0")
    assert [x["sequence"] for x in e["calls"]] == [0, 1]
    assert e["policy_versions"] == [0, 0]
    assert e["calls"][1]["messages"][-1] == {"role": "user", "content": "r1 turn 1"}
    assert e["calls"][1]["response_message"]["content"] == "Reply to: r1 turn 1"
    assert not h.shard_files(shards), "delivered before any shard was published"
    cursor = got[-1]["cursor"]
    c.crash()

    # While the trainer is down: a rollout finishes, the proxy is killed,
    # comes back (replaying its WAL into the feed again), another finishes.
    rollout(proxy, "r3", turns=1, reward=0.5, group="g1")
    proxy.proc.popen.kill()
    proxy.proc.popen.wait()
    proxy = make_proxy(FEED, shards=shards, name="again")
    rollout(proxy, "r4", turns=3, reward=1.0, group="g2")

    c2 = Consumer(proxy.url, after=cursor)
    got2 = c2.wait_for(2)
    time.sleep(0.3)
    assert [(e["cursor"], e["rollout_id"]) for e in c2.entries] == [(4, "r3"), (5, "r4")], c2.entries
    assert [len(e["calls"]) for e in c2.entries] == [1, 3]
    # A rollout that finishes now reaches the following consumer at once.
    rollout(proxy, "r5", turns=1, reward=0.0, group="g2")
    assert c2.wait_for(3)[-1]["rollout_id"] == "r5"
    seen = [e["rollout_id"] for e in got + c2.entries]
    assert seen == [f"r{i}" for i in range(6)], "each rollout exactly once"
    c2.crash()

    # Arrow IPC, not following: the entries there are, then the end.
    r = h.raw_request(proxy.url, "GET", "/v1/rollouts/feed?after=2&format=arrow&follow=false")
    assert r.status == 200 and r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    t = ipc.open_stream(r.body).read_all()
    assert t.column("cursor").to_pylist() == [3, 4, 5, 6]
    assert t.column("rollout_id").to_pylist() == ["r2", "r3", "r4", "r5"]
    assert t.column("policy_versions").to_pylist()[2] == [0, 0, 0]
    assert json.loads(t.column("entry")[0].as_py())["calls"][0]["sequence"] == 0
    # Bad queries are clear errors; a proxy without the feed says how to turn it on.
    bad = h.raw_request(proxy.url, "GET", "/v1/rollouts/feed?after=soon")
    assert bad.status == 400 and "whole number" in bad.body.decode()
    plain = make_proxy(name="nofeed", shards=tmp_path / "nofeed-shards")
    off = h.raw_request(plain.url, "GET", "/v1/rollouts/feed")
    assert off.status == 404 and "shards.feed = true" in off.body.decode()
