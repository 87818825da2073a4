"""500 rollouts at once through one proxy (a bounded client pool), then a
check in DuckDB that every row is there exactly once, in its own rollout, in
order, with its own request and answer."""

from __future__ import annotations

import asyncio
import json

from urllib.parse import urlsplit

import rollcall_harness as h

ROLLOUTS = 500
POOL = 48


def calls_for(i: int) -> int:
    return 2 + (i % 2)  # 2 or 3 calls per rollout


def content(i: int, j: int) -> str:
    return f"rollout-{i}-call-{j}"


def streams(i: int, j: int) -> bool:
    return (i + j) % 2 == 1


def api_for(j: int) -> str:
    return "responses" if j == 2 else "chat_completions"


class Pool:
    """A bounded pool of keep-alive HTTP/1.1 connections over asyncio streams
    (a minimal client: Content-Length requests; Content-Length or chunked
    responses), light enough to keep 500 rollouts busy on two cores."""

    def __init__(self, base: str, size: int):
        u = urlsplit(base)
        self.host, self.port, self.size = u.hostname, u.port, size
        self.idle: asyncio.Queue = asyncio.Queue()
        self.opened = 0

    async def _get(self):
        if self.idle.empty() and self.opened < self.size:
            self.opened += 1
            return await asyncio.open_connection(self.host, self.port)
        return await self.idle.get()

    async def post(self, path: str, body: bytes) -> tuple[int, dict, bytes]:
        reader, writer = await self._get()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        else:
            assert headers.get("transfer-encoding") == "chunked", headers
            parts = []
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                parts.append(await reader.readexactly(size))
                await reader.readline()
            data = b"".join(parts)
        if headers.get("connection") == "close":
            writer.close()
            self.opened -= 1
        else:
            self.idle.put_nowait((reader, writer))
        return status, headers, data

    def close(self) -> None:
        while not self.idle.empty():
            self.idle.get_nowait()[1].close()


async def one_call(pool: Pool, i: int, j: int) -> str:
    q = content(i, j)
    stream = streams(i, j)
    if api_for(j) == "responses":
        path, body = "responses", {"model": "scripted@events=3", "input": q, "stream": stream}
    else:
        path, body = "chat/completions", {
            "model": "scripted@events=3",
            "messages": [{"role": "user", "content": q}],
            "stream": stream,
        }
    status, headers, raw = await pool.post(f"/rollouts/conc-{i}/v1/{path}", json.dumps(body).encode())
    assert status == 200, raw
    if not stream:
        v = json.loads(raw)
        if path == "responses":
            return v["output"][0]["content"][0]["text"]
        return v["choices"][0]["message"]["content"]
    assert headers["content-type"].startswith("text/event-stream")
    text, done = "", False
    for event, data in h.sse_events(raw):
        if data == "[DONE]":
            done = True
            continue
        v = json.loads(data)
        if path == "responses":
            if v["type"] == "response.output_text.delta":
                text += v["delta"]
            done = done or v["type"] == "response.completed"
        else:
            text += "".join(c["delta"].get("content") or "" for c in v["choices"])
    assert done, f"stream for {q} did not complete"
    return text


async def run_all(base: str) -> dict[tuple[int, int], str]:
    answers: dict[tuple[int, int], str] = {}
    pool = Pool(base, POOL)

    async def rollout(i: int) -> None:
        for j in range(calls_for(i)):  # a rollout's calls are sequential
            answers[(i, j)] = await one_call(pool, i, j)

    try:
        await asyncio.wait_for(asyncio.gather(*(rollout(i) for i in range(ROLLOUTS))), 120)
    finally:
        pool.close()
    return answers


def test_500_concurrent_rollouts(proxy):
    answers = asyncio.run(run_all(proxy.url))
    expected = {(i, j) for i in range(ROLLOUTS) for j in range(calls_for(i))}
    assert set(answers) == expected
    for (i, j), text in answers.items():
        assert text == f"Reply to: {content(i, j)}", (i, j, text)

    h.wait_for_shards(proxy.url)
    S = proxy.shards
    total = len(expected)
    assert h.duck(S, "SELECT count(*), count(DISTINCT call_id) FROM t") == [(total, total)]
    assert h.duck(S, "SELECT count(*) FROM (SELECT DISTINCT rollout_id, sequence FROM t)") == [(total,)]
    assert h.duck(S, "SELECT status, count(*) FROM t GROUP BY status") == [("ok", total)]

    # per rollout: exactly the expected number of calls, sequences 0..n-1
    per = h.duck(
        S,
        "SELECT rollout_id, count(*), min(sequence), max(sequence), count(DISTINCT sequence), "
        "list(sequence ORDER BY received_at) FROM t GROUP BY rollout_id",
    )
    assert len(per) == ROLLOUTS
    for rollout_id, n, lo, hi, distinct, in_arrival_order in per:
        i = int(rollout_id.removeprefix("conc-"))
        assert (n, lo, hi, distinct) == (calls_for(i), 0, calls_for(i) - 1, calls_for(i)), rollout_id
        assert in_arrival_order == list(range(n)), rollout_id

    # every row carries its own rollout's request and answer
    rows = h.duck_dicts(
        S,
        "SELECT rollout_id, sequence, wire_api, stream, request, response, response_message, response_raw FROM t",
    )
    assert len(rows) == total
    for r in rows:
        i = int(r["rollout_id"].removeprefix("conc-"))
        j = r["sequence"]
        q = content(i, j)
        req = json.loads(r["request"])
        assert h.last_user_text(req) == q, (r["rollout_id"], j, r["request"])
        assert r["wire_api"] == api_for(j)
        assert r["stream"] is streams(i, j)
        assert json.loads(r["response_message"])["content"] == f"Reply to: {q}"
        resp = json.loads(r["response"])
        if r["wire_api"] == "responses":
            assert resp["output"][0]["content"][0]["text"] == f"Reply to: {q}"
        else:
            assert resp["choices"][0]["message"]["content"] == f"Reply to: {q}"
        # no other rollout's content leaked into this row
        assert f"rollout-{i}-call-{j}".encode() in r["response_raw"] or r["stream"]
        for other in (f"rollout-{i + 1}-", f"rollout-{i - 1}-"):
            assert other not in r["request"] and other.encode() not in r["response_raw"]

    # the same counts through pyarrow
    arrow_rows = h.read_calls_arrow(S)
    assert len(arrow_rows) == total
    assert len({(r["rollout_id"], r["sequence"]) for r in arrow_rows}) == total
