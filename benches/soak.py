#!/usr/bin/env python3
"""Soak rollcall: a mixed load for N minutes against a real `rollcall serve`
in front of the scripted upstream, then an audit of every row it wrote.

The scripted upstream is the `scripted-upstream` binary beside `--bin` (cargo
builds both into one target directory).

What it measures
  * Losslessness: every call the proxy accepted (it received the whole
    request and answered at least a response head, or we hung up after
    sending it) has a row, and every call whose answer the client received
    completely has a row with `status = ok` (unless the upstream was told to
    fail). Exactly once: no nonce has two rows.
  * Stability: RSS and open file descriptors of the proxy after a warm-up
    (~30 s or 10 % of the run) and at the end; WAL bytes and segments then,
    and what the WAL holds after a graceful stop (SIGTERM).
  * With `--kills K`: SIGKILL the proxy K times at random moments and restart
    it on the same shards directory and port. Calls cut off by a kill that
    the proxy had begun must be `incomplete`/`interrupted` rows; `complete`
    calls must still have their `ok` row; nothing may be recorded twice.

The load: W workers, each with a handful of rollout ids (finished now and
then with `POST /v1/rollouts/<id>/finish`), calling Chat Completions,
Responses, Completions and Messages, streaming or not, evenly; 1 % client
hang-ups (before the response head for whole bodies, mid-stream for
streams), 1 % malformed upstream answers (`fault=malformed|garbage|drop`),
1 % upstream 500s, and a few percent of streams read slowly. Each call
carries a unique nonce in its user text (the scripted model answers
`Reply to: <text>`), which matches rows to calls through `request`.

Client-side outcome of each call: `complete` (the whole JSON body, or the
stream through `[DONE]` / `response.completed` / `message_stop`), `error`
(an error status or event, or a body that is not a whole answer),
`hung_up` (we closed it), `cut` (the connection broke while the proxy was
being killed), `timeout` (client timeout), `refused` (never sent: the proxy
was not listening).

    .venv/bin/python benches/soak.py --bin target/release/rollcall --minutes 10 [--kills 3]

Exit status 0 on PASS, 1 on FAIL. Everything runs on loopback and is bounded
by timeouts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow.dataset as ds

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import rollcall_harness as h  # noqa: E402

CLIENT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
ROLLOUTS_PER_WORKER = 4
PATHS = {"chat": "chat/completions", "responses": "responses", "completions": "completions", "messages": "messages"}
TERMINAL = {"chat": "[DONE]", "completions": "[DONE]", "responses": "response.completed", "messages": "message_stop"}
FAULTED = {"500", "malformed", "garbage", "drop"}  # the upstream is told to fail

CONFIG = """
[server]
shutdown_grace_secs = 10
[shards]
max_age_secs = 1
[[routes]]
name = "openai"
url = "{upstream}/v1"
response_timeout_secs = 10
idle_timeout_secs = 10
[[routes]]
name = "anthropic"
url = "{upstream}/v1"
kind = "anthropic"
models = ["claude-*"]
response_timeout_secs = 10
idle_timeout_secs = 10
"""


@dataclass(slots=True)
class Call:
    nonce: str
    api: str
    stream: bool
    kind: str  # normal | slow | hangup | 500 | malformed | garbage | drop
    t0: float
    t1: float = 0.0
    sent: bool = False  # the whole request was written (raw-socket hang-ups)
    head: bool = False  # a response head arrived
    outcome: str = ""
    detail: str = ""


@dataclass
class Sample:
    t: float
    gen: int
    rss_kib: int
    fds: int
    wal_bytes: int
    wal_segments: int


def wal_usage(shards: Path) -> tuple[int, int]:
    d = shards / "wal"
    files = [f for f in d.iterdir() if f.is_file()] if d.exists() else []
    return sum(f.stat().st_size for f in files), sum(1 for f in files if re.fullmatch(r"wal-.*\.log", f.name))


def proc_usage(pid: int) -> tuple[int, int]:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Soak:
    def __init__(self, a: argparse.Namespace, workdir: Path):
        self.a, self.workdir = a, workdir
        self.rng = random.Random(a.seed)
        self.run_id = "%06x" % self.rng.randrange(1 << 24)
        self.shards = workdir / "shards"
        self.duration = a.minutes * 60.0
        self.warmup = min(30.0, 0.1 * self.duration)
        self.calls: list[Call] = []
        self.finished: Counter = Counter()  # rollout id -> finishes acknowledged
        self.finish_errors = 0
        self.windows: list[list[float]] = []  # [killed at, back up at + 1 s] of each kill
        self.restarts: list[tuple[float, float]] = []  # (at, seconds until ready)
        self.restart_failures: list[str] = []
        self.unexpected_exits: list[str] = []
        self.samples: list[Sample] = []
        self.gen = 0
        self.gen_started = 0.0
        self.up = asyncio.Event()
        self.busy = False  # a kill or restart is under way

    # ------------------------------------------------------------ processes

    def start_proxy(self, port: int) -> h.Proc:
        n = len(list(self.workdir.glob("proxy.*.stderr")))
        args = ["serve", "--config", str(self.workdir / "proxy.toml"), "--listen", f"127.0.0.1:{port}",
                "--shards", str(self.shards)]
        return h.Proc(args, "rollcall listening on ", self.workdir / f"proxy.{n}.stderr",
                      env={"ROLLCALL_LOG": os.environ.get("ROLLCALL_LOG", "warn")})

    async def restart(self, why: str) -> bool:
        t = time.monotonic()
        for attempt in range(5):
            try:
                self.proxy = await asyncio.to_thread(self.start_proxy, self.port)
                break
            except Exception as e:  # reported, then tried again
                self.restart_failures.append(f"{why}, attempt {attempt + 1}: {str(e)[-600:]}")
                await asyncio.sleep(1.0)
        else:
            return False
        now = time.monotonic()
        self.restarts.append((t - self.t_start, now - t))
        self.windows[-1][1] = now + 1.0
        self.gen += 1
        self.gen_started = now
        self.up.set()
        return True

    async def kill_and_restart(self) -> bool:
        self.busy = True
        self.windows.append([time.monotonic(), float("inf")])
        self.proxy.popen.kill()  # SIGKILL, with calls in flight
        self.up.clear()
        await asyncio.to_thread(self.proxy.kill)  # reap
        ok = await self.restart("restart after SIGKILL")
        self.busy = False
        return ok

    def in_kill_window(self, c: Call) -> bool:
        return any(c.t0 <= end and c.t1 >= start for start, end in self.windows)

    # ----------------------------------------------------------------- load

    def plan(self, k: int, n: int) -> tuple[Call, bytes]:
        r = self.rng
        api, stream = r.choice(list(PATHS)), r.random() < 0.5
        x = r.random()
        kind = ("hangup" if x < 0.01 else r.choice(["malformed", "garbage", "drop"]) if x < 0.02
                else "500" if x < 0.03 else "slow" if stream and x < 0.07 else "normal")
        model = "claude-soak" if api == "messages" else "m"
        if kind == "hangup":
            model += "@events=10@delay_ms=20" if stream else "@ttfb_ms=200"
        elif kind in FAULTED:
            model += f"@fault={kind}" + ("@events=8@delay_ms=2" if stream else "")
        elif stream:
            model += f"@events={r.randint(2, 8)}@delay_ms={r.choice([0, 1, 2, 5])}"
        c = Call(f"soak-{self.run_id}-w{k}-{n}", api, stream, kind, time.monotonic())
        text = f"please answer {c.nonce}"
        body: dict = {"model": model, "stream": stream}
        if api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        elif api == "messages":
            body |= {"max_tokens": 64, "messages": [{"role": "user", "content": text}]}
        elif api == "responses":
            body["input"] = text
        else:
            body["prompt"] = text
        return c, json.dumps(body).encode()

    async def worker(self, k: int, client: httpx.AsyncClient) -> None:
        rollouts = {f"soak-{self.run_id}-w{k}-r{i}": self.rng.randint(10, 40) for i in range(ROLLOUTS_PER_WORKER)}
        n, serial = 0, ROLLOUTS_PER_WORKER
        while (left := self.deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self.up.wait(), left)
            except asyncio.TimeoutError:
                return
            rid = self.rng.choice(list(rollouts))
            c, body = self.plan(k, n)
            n += 1
            self.calls.append(c)
            path = f"/rollouts/{rid}/v1/{PATHS[c.api]}"
            if c.kind == "hangup":
                await self.hang_up(c, path, body)
            else:
                await self.call(client, c, path, body)
            c.t1 = time.monotonic()
            if c.outcome == "error" and c.detail.startswith("transport") and self.in_kill_window(c):
                c.outcome = "cut"  # the connection broke while the proxy was being killed
            rollouts[rid] -= 1
            if rollouts[rid] <= 0:  # the rollout is done: finish it, start another
                del rollouts[rid]
                rollouts[f"soak-{self.run_id}-w{k}-r{serial}"] = self.rng.randint(10, 40)
                serial += 1
                try:
                    r = await client.post(f"/v1/rollouts/{rid}/finish", json={"status": "success", "reward": 1.0})
                    if r.status_code == 200:
                        self.finished[rid] += 1
                    else:
                        self.finish_errors += 1
                except httpx.HTTPError:
                    self.finish_errors += 1

    async def call(self, client: httpx.AsyncClient, c: Call, path: str, body: bytes) -> None:
        headers = {"content-type": "application/json"}
        if c.api == "messages":
            headers["anthropic-version"] = "2023-06-01"
        got = bytearray()
        try:
            async with client.stream("POST", path, content=body, headers=headers) as r:
                c.head = True
                async for chunk in r.aiter_raw():
                    got += chunk
                    if c.kind == "slow":
                        await asyncio.sleep(self.rng.uniform(0.05, 0.2))
            c.outcome, c.detail = judge(c, r.status_code, bytes(got), None)
        except httpx.ConnectError as e:
            c.outcome, c.detail = "refused", f"transport {type(e).__name__}"
        except httpx.ReadTimeout:
            c.outcome, c.detail = "timeout", "read timeout"
        except httpx.TimeoutException as e:
            c.outcome, c.detail = "refused" if not c.head else "timeout", type(e).__name__
        except httpx.TransportError as e:
            if c.head:
                c.outcome, c.detail = judge(c, r.status_code, bytes(got), e)
            else:
                c.outcome, c.detail = "error", f"transport {type(e).__name__} before head"

    async def hang_up(self, c: Call, path: str, body: bytes) -> None:
        """Raw socket: send the whole request, then close the connection
        before the response head (whole body: the upstream waits 200 ms) or
        after the first stream event."""
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"anthropic-version: 2023-06-01\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 5)
            writer.write(head + body)
            await writer.drain()
            c.sent = True
            if c.stream:
                got = b""
                while b"data: " not in got:
                    chunk = await asyncio.wait_for(reader.read(4096), 10)
                    if not chunk:
                        raise ConnectionError("closed before the first event")
                    got += chunk
                c.head = True
            else:
                await asyncio.sleep(0.05)
            c.outcome = "hung_up"
        except asyncio.TimeoutError:
            c.outcome, c.detail = "timeout", "hang-up call timed out"
        except OSError as e:
            c.outcome = "error" if c.sent else "refused"
            c.detail = f"transport {type(e).__name__}"
        finally:
            if writer is not None:
                writer.close()

    # ------------------------------------------------------------- monitor

    def sample(self) -> Sample | None:
        try:
            rss, fds = proc_usage(self.proxy.pid)
        except OSError:
            return None
        wb, ws = wal_usage(self.shards)
        return Sample(time.monotonic() - self.t_start, self.gen, rss, fds, wb, ws)

    async def monitor(self, client: httpx.AsyncClient) -> None:
        every = 10.0 if self.duration <= 120 else 30.0
        next_print = every
        while time.monotonic() < self.deadline:
            await asyncio.sleep(1.0)
            if not self.busy and not self.proxy.alive():
                rc = self.proxy.popen.returncode
                self.unexpected_exits.append(f"at {time.monotonic() - self.t_start:.0f}s rc={rc}: "
                                             f"{self.proxy.stderr_text()[-600:]}")
                print(f"!! proxy exited by itself (rc={rc}); restarting", flush=True)
                self.busy = True
                self.windows.append([time.monotonic(), float("inf")])
                self.up.clear()
                self.proxy.kill()
                ok = await self.restart("restart after an unexpected exit")
                self.busy = False
                if not ok:
                    return
            if (s := self.sample()) is not None:
                self.samples.append(s)
            t = time.monotonic() - self.t_start
            if t >= next_print and s is not None:
                next_print += every
                lag = await shard_lag(client)
                print(f"[{t:5.0f}s] calls {len(self.calls):7d} ({len(self.calls) / t:6.0f}/s)  rss {s.rss_kib / 1024:6.1f} MiB"
                      f"  fds {s.fds:4d}  wal {s.wal_bytes / 2**20:7.2f} MiB in {s.wal_segments} seg  lag {lag}",
                      flush=True)

    async def killer(self) -> None:
        k = self.a.kills
        lo, hi = self.warmup, 0.8 * self.duration
        slots = [lo + (hi - lo) * i / k for i in range(k + 1)]
        for i in range(k):
            at = self.rng.uniform(slots[i] + 0.5, max(slots[i] + 0.5, slots[i + 1] - 0.5))
            await asyncio.sleep(max(0.0, self.t_start + at - time.monotonic()))
            while self.busy:
                await asyncio.sleep(0.1)
            inflight = sum(1 for c in self.calls if not c.outcome)
            print(f"-- SIGKILL {i + 1}/{k} at {time.monotonic() - self.t_start:.1f}s with {inflight} calls in flight",
                  flush=True)
            if not await self.kill_and_restart():
                print("!! restart failed; stopping the load", flush=True)
                self.deadline = time.monotonic()
                return
            print(f"   restarted in {self.restarts[-1][1]:.2f}s", flush=True)

    async def run(self) -> int:
        os.environ["ROLLCALL_BIN"] = str(Path(self.a.bin).resolve())
        self.upstream = h.start_upstream(self.workdir)
        (self.workdir / "proxy.toml").write_text(CONFIG.format(upstream=self.upstream.url))
        self.proxy = self.start_proxy(0)
        self.port = int(self.proxy.url.rsplit(":", 1)[1])
        self.up.set()
        print(f"soak {self.run_id}: {self.a.minutes} min, {self.a.workers} workers, {self.a.kills} kills; "
              f"proxy {self.proxy.url} (pid {self.proxy.pid}), upstream {self.upstream.url}; work dir {self.workdir}",
              flush=True)
        limits = httpx.Limits(max_connections=self.a.workers + 4, max_keepalive_connections=self.a.workers + 4)
        async with httpx.AsyncClient(base_url=self.proxy.url, timeout=CLIENT_TIMEOUT, limits=limits,
                                     trust_env=False) as client, \
                httpx.AsyncClient(base_url=self.proxy.url, timeout=5.0, trust_env=False) as mclient:
            self.t_start = self.gen_started = time.monotonic()
            self.deadline = self.t_start + self.duration
            workers = [asyncio.create_task(self.worker(k, client)) for k in range(self.a.workers)]
            side = [asyncio.create_task(self.monitor(mclient))]
            if self.a.kills:
                side.append(asyncio.create_task(self.killer()))
            done, pending = await asyncio.wait(workers, timeout=self.duration + 60)
            for t in pending:
                t.cancel()
            for c in self.calls:
                if not c.outcome:
                    c.outcome, c.detail = "timeout", "still running at the end"
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            self.load_secs = time.monotonic() - self.t_start
            self.end_sample = self.sample()
            self.end_lag = await shard_lag(mclient)
        t = time.monotonic()
        try:
            self.exit_rc = self.proxy.terminate(60)
        except Exception as e:  # did not exit in time
            self.exit_rc = f"no exit within 60 s of SIGTERM ({type(e).__name__}); killed"
            self.proxy.kill()
        self.stop_secs = time.monotonic() - t
        self.wal_after = wal_usage(self.shards)
        self.upstream.kill()
        return self.report()

    # -------------------------------------------------------------- report

    def report(self) -> int:
        pat = re.compile(rf"soak-{self.run_id}-w\d+-\d+")
        files = h.shard_files(self.shards, "calls")
        cols = ["call_id", "rollout_id", "sequence", "wire_api", "stream", "status", "failure_class", "request"]
        rows = ds.dataset([str(f) for f in files], format="parquet").to_table(columns=cols).to_pylist() if files else []
        by_nonce: dict[str, list[dict]] = defaultdict(list)
        foreign = 0
        for r in rows:
            m = pat.search(r["request"] or "")
            if m:
                by_nonce[m.group(0)].append(r)
            else:
                foreign += 1
        calls = {c.nonce: c for c in self.calls}
        unknown = [n for n in by_nonce if n not in calls]
        sent = [c for c in self.calls if c.outcome != "refused"]
        accepted = [c for c in sent if c.head or c.sent or (c.outcome == "timeout" and c.detail == "read timeout")]
        # a cut call without a response head may never have reached the proxy: not lost, reported apart
        lost = [c for c in accepted if not by_nonce.get(c.nonce) and not (c.outcome == "cut" and not c.head)]
        complete_not_ok = [c for c in self.calls if c.outcome == "complete" and c.kind not in FAULTED
                           and by_nonce.get(c.nonce) and any(r["status"] != "ok" for r in by_nonce[c.nonce])]
        dup = [n for n, rs in by_nonce.items() if len(rs) > 1]
        seqs = Counter((r["rollout_id"], r["sequence"]) for r in rows)
        seq_clash = sum(1 for v in seqs.values() if v > 1)

        def row_key(c: Call) -> str:
            rs = by_nonce.get(c.nonce)
            return "no row" if not rs else "+".join(f"{r['status']}/{r['failure_class'] or '-'}" for r in rs)

        P = lambda *x: print(*x, flush=True)  # noqa: E731
        P("\n================ rollcall soak report ================")
        P(f"run {self.run_id}: {self.load_secs:.0f} s of load, {self.a.workers} workers, binary {self.a.bin}")
        P(f"calls sent          {len(sent):8d}   ({len(sent) / self.load_secs:.0f} calls/s)"
          f"   refused/not sent {len(self.calls) - len(sent)}"
          f" ({sum(1 for c in self.calls if c.outcome == 'refused' and self.in_kill_window(c))} during a kill)")
        P(f"calls accepted      {len(accepted):8d}")
        P(f"rows                {len(rows):8d}   (for {len(by_nonce)} nonces; rows matching no call {foreign + sum(len(by_nonce[n]) for n in unknown)})")
        P(f"lost                {len(lost):8d}   (accepted calls with no row)")
        P(f"complete, row !ok   {len(complete_not_ok):8d}   (complete calls, upstream not told to fail, whose row is not ok)")
        P(f"duplicated          {len(dup):8d}   (nonces with more than one row)")
        P(f"sequence clashes    {seq_clash:8d}   (two rows with one (rollout_id, sequence))")
        P("\nclient outcome x call kind:")
        oc = Counter((c.outcome, c.kind) for c in self.calls)
        kinds = sorted({k for _, k in oc})
        P("  " + " " * 10 + "".join(f"{k:>10}" for k in kinds))
        for o in sorted({o for o, _ in oc}):
            P(f"  {o:<10}" + "".join(f"{oc[(o, k)]:>10}" for k in kinds))
        P("\nrows per status / failure_class:")
        for (s, f), n in sorted(Counter((r["status"], r["failure_class"]) for r in rows).items(), key=str):
            P(f"  {s:<11} {str(f):<24} {n:8d}")
        P("\nrow(s) per client outcome (and call kind when not normal):")
        cross: dict[str, Counter] = defaultdict(Counter)
        for c in self.calls:
            how = "stream" if c.stream else "whole"
            cross[c.outcome if c.kind == "normal" else f"{c.outcome} [{c.kind}, {how}]"][row_key(c)] += 1
        for k in sorted(cross):
            P(f"  {k:<30} " + ", ".join(f"{v} {n}" for v, n in cross[k].most_common()))
        details = Counter((c.outcome, c.detail) for c in self.calls if c.detail)
        if details:
            P("\nclient-side details:")
            for (o, d), n in details.most_common(12):
                P(f"  {o:<8} {d[:90]:<90} {n:7d}")
        if lost:
            P("\nlost, by outcome/kind/api/stream: " + ", ".join(
                f"{k}: {n}" for k, n in Counter(f"{c.outcome}/{c.kind}/{c.api}/{'stream' if c.stream else 'whole'}"
                                                for c in lost).most_common(10)))
            P("  e.g. " + ", ".join(c.nonce for c in lost[:5]))
        if complete_not_ok:
            P("complete but not ok, e.g.: " + ", ".join(f"{c.nonce} ({c.api}, {row_key(c)})" for c in complete_not_ok[:5]))
        if dup:
            P("duplicated, e.g.: " + ", ".join(f"{n} ({row_key(calls[n]) if n in calls else '?'})" for n in dup[:5]))

        # rollouts
        rfiles = h.shard_files(self.shards, "rollouts")
        rrows = ds.dataset([str(f) for f in rfiles], format="parquet").to_table(columns=["rollout_id"]).to_pylist() if rfiles else []
        got = Counter(r["rollout_id"] for r in rrows)
        missing = sum(1 for rid in self.finished if got[rid] < self.finished[rid])
        P(f"\nrollouts finished   {sum(self.finished.values()):8d}   (errors {self.finish_errors}); rollout rows {len(rrows)};"
          f" acknowledged finishes missing a row {missing}")

        # resources
        final = [s for s in self.samples if s.gen == self.gen]
        base = next((s for s in final if s.t >= (self.gen_started - self.t_start) + self.warmup), None)
        first = next((s for s in self.samples if s.t >= self.warmup), None)
        base = base or first
        end = self.end_sample
        P("\nproxy process        after warm-up          at the end")
        if base and end:
            P(f"  RSS              {base.rss_kib / 1024:9.1f} MiB  (t={base.t:4.0f}s)  {end.rss_kib / 1024:9.1f} MiB"
              f"  ({(end.rss_kib / base.rss_kib - 1) * 100:+.1f} %)")
            P(f"  open fds         {base.fds:9d}                {end.fds:9d}")
            P(f"  WAL bytes        {base.wal_bytes:9d}                {end.wal_bytes:9d}")
            P(f"  WAL segments     {base.wal_segments:9d}                {end.wal_segments:9d}")
            if self.gen and first is not base:
                P(f"  (the baseline is the last incarnation's; the first one's was {first.rss_kib / 1024:.1f} MiB RSS,"
                  f" {first.fds} fds at t={first.t:.0f}s)")
        peak = max(self.samples, key=lambda s: s.rss_kib, default=None)
        if peak:
            P(f"  peak RSS {peak.rss_kib / 1024:.1f} MiB at t={peak.t:.0f}s; peak WAL "
              f"{max(s.wal_bytes for s in self.samples)} bytes / {max(s.wal_segments for s in self.samples)} segments")
        P(f"  shard_lag_rows before SIGTERM: {self.end_lag}")
        P(f"graceful stop: exit {self.exit_rc} after {self.stop_secs:.1f} s; WAL left {self.wal_after[0]} bytes in "
          f"{self.wal_after[1]} segment(s)")

        checks = [
            ("lost = 0", len(lost) == 0 and len(complete_not_ok) == 0,
             f"{len(lost)} lost, {len(complete_not_ok)} complete calls without an ok row"),
            ("duplicated = 0", len(dup) == 0, f"{len(dup)}"),
            ("RSS at the end within 10 % of after warm-up", bool(base and end and end.rss_kib <= 1.10 * base.rss_kib),
             f"{base.rss_kib / 1024:.1f} -> {end.rss_kib / 1024:.1f} MiB" if base and end else "no sample"),
            ("at most two WAL segments left after SIGTERM", self.wal_after[1] <= 2, f"{self.wal_after[1]}"),
            ("graceful stop exits 0", self.exit_rc == 0, f"{self.exit_rc}"),
            ("no rows for calls never made", foreign == 0 and not unknown, f"{foreign + len(unknown)}"),
            ("the proxy never exited by itself", not self.unexpected_exits, "; ".join(self.unexpected_exits)[:800]),
        ]
        if self.a.kills:
            cut = [c for c in self.calls if c.outcome == "cut"]
            cut_inc = sum(1 for c in cut if any(r["status"] == "incomplete" and r["failure_class"] == "interrupted"
                                                for r in by_nonce.get(c.nonce, [])))
            cut_none_head = sum(1 for c in cut if not by_nonce.get(c.nonce) and c.head)
            cut_none = sum(1 for c in cut if not by_nonce.get(c.nonce) and not c.head)
            cut_other = Counter(row_key(c) for c in cut if by_nonce.get(c.nonce) and not any(
                r["status"] == "incomplete" for r in by_nonce[c.nonce]))
            n_inc = sum(1 for r in rows if r["status"] == "incomplete" and r["failure_class"] == "interrupted")
            P(f"\nkills: {len(self.restarts)} restart(s) of {self.a.kills}, "
              + ", ".join(f"at {at:.0f}s ready in {d:.2f}s" for at, d in self.restarts))
            for f in self.restart_failures:
                P(f"  restart failure: {f}")
            P(f"cut calls {len(cut)}: incomplete row {cut_inc}; no row, head seen (lost) {cut_none_head};"
              f" no row, no head (maybe never received) {cut_none}; ok/failed row {sum(cut_other.values())}"
              + (f" ({', '.join(f'{n} {k}' for k, n in cut_other.most_common())})" if cut_other else ""))
            P(f"incomplete/interrupted rows in all: {n_inc}")
            checks += [
                ("every restart succeeded", not self.restart_failures and len(self.restarts) >= self.a.kills,
                 f"{len(self.restart_failures)} failed attempt(s)"),
                ("at least one incomplete row over the kill run", n_inc >= 1, f"{n_inc}"),
            ]
        P("\nacceptance:")
        for name, ok, why in checks:
            P(f"  {'PASS' if ok else 'FAIL'}  {name:<46} {why}")
        failed = not all(ok for _, ok, _ in checks)
        P(f"\n{'FAIL' if failed else 'PASS'}  (work dir {self.workdir}{' kept' if failed or self.a.keep else ' removed'})")
        errs = [ln for p in sorted(self.workdir.glob("proxy.*.stderr"))
                for ln in p.read_text("utf-8", "replace").splitlines() if re.search(r"ERROR|panick", ln)]
        if errs:
            P(f"proxy stderr: {len(errs)} ERROR/panic line(s), first distinct ones:")
            for ln in list(dict.fromkeys(ln[-300:] for ln in errs))[:5]:
                P(f"  {ln}")
        return 1 if failed else 0


def judge(c: Call, status: int, body: bytes, err: BaseException | None) -> tuple[str, str]:
    """The client's view of a call whose response head arrived."""
    what = f"transport {type(err).__name__}" if err is not None else ""
    if status != 200:
        return "error", f"http {status}"
    if not c.stream:
        if err is not None:
            return "error", what
        try:
            obj = json.loads(body)
        except ValueError:
            return "error", "200 with a body that is not JSON"
        if not isinstance(obj, dict) or "error" in obj or obj.get("type") == "error":
            return "error", "200 with an error object"
        if c.nonce.encode() not in body:
            return "error", "answer does not quote the nonce"
        return "complete", ""
    whole = body[: body.rfind(b"\n\n") + 2] if b"\n\n" in body else b""
    events = h.sse_events(whole)
    term, done = TERMINAL[c.api], False
    for ev, data in events:
        obj = None
        if data.startswith("{") and ("error" in data or term in data):
            try:
                obj = json.loads(data)
            except ValueError:
                obj = None
        if ev == "error" or (isinstance(obj, dict) and ("error" in obj or obj.get("type") == "error")):
            return "error", "error event" + (f", then {what}" if what else "")
        done = done or data == term or ev == term or (isinstance(obj, dict) and obj.get("type") == term)
    if done:
        return "complete", ""
    if err is not None:
        return "error", what + " without an error event"
    return "error", "stream ended without its terminal event"


async def shard_lag(client: httpx.AsyncClient) -> str:
    try:
        return str((await client.get("/healthz")).json()["shard_lag_rows"])
    except Exception as e:  # the proxy may be wedged: report, don't stop
        return f"? ({type(e).__name__})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=str(REPO / "target" / "release" / "rollcall"))
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--kills", type=int, default=0)
    p.add_argument("--workers", type=int, default=24)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--workdir", default=None, help="default: a new temporary directory")
    p.add_argument("--keep", action="store_true", help="keep the work dir (always kept on FAIL)")
    a = p.parse_args()
    for b in (Path(a.bin), Path(a.bin).with_name("scripted-upstream")):
        if not b.exists():
            p.error(f"no binary at {b} (make build, or --bin PATH)")
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="rollcall-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rc = asyncio.run(Soak(a, workdir).run())
    if rc == 0 and not a.keep and not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
