"""`make demo`: rollcall end to end on one machine.

Starts the scripted model server (a stand-in for a real model server until the
embedded model lands), starts rollcall in front of it, runs a few agent
rollouts through it (each in its own working directory under its own rollout
id, over Chat Completions and Responses, streaming and not), checks each
task's outcome and finishes the rollout with that reward, then prints what
landed in the shards, read back with DuckDB.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
import agent  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

TASKS = [
    ("demo-chat-0", "chat", False, "Print the word scripted with echo."),
    ("demo-chat-1", "chat", True, "Show which shell runs your commands."),
    ("demo-resp-0", "responses", True, "Write a note to note.txt."),
    ("demo-resp-1", "responses", False, "Say hello from the working directory."),
]


def start(cmd, prefix):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith(prefix):
        p.kill()
        sys.exit(f"demo: {cmd[1]} did not start: {line!r}")
    return p, line[len(prefix):]


def finish(proxy, rollout, status, reward, metadata):
    body = json.dumps({"status": status, "reward": reward, "metadata": metadata}).encode()
    req = urllib.request.Request(f"{proxy}/v1/rollouts/{rollout}/finish", data=body, method="POST")
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/rollcall"))
    ap.add_argument("--out", default=str(ROOT / "demo-out"))
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    shards = out / "shards"
    t0 = time.time()
    upstream_url = os.environ.get("ROLLCALL_UPSTREAM")
    up = None
    kind = []
    if not upstream_url:
        up, base = start([a.bin, "scripted-upstream", "--listen", "127.0.0.1:0"], "scripted upstream listening on ")
        upstream_url = base + "/v1"
        # The scripted upstream answers vLLM's token-id fields, so RL samples come out.
        kind = ["--upstream-kind", "vllm"]
    px, proxy = start([a.bin, "serve", "--config", str(ROOT / "proxy-config/demo.toml"), "--listen", "127.0.0.1:0",
                       "--upstream", upstream_url, "--shards", str(shards), *kind], "rollcall listening on ")
    print(f"upstream  {upstream_url}\nrollcall  {proxy}\nshards    {shards}\n")
    try:
        for rollout, api, stream, task in TASKS:
            workdir = out / "work" / rollout
            workdir.mkdir(parents=True)
            start_t = time.time()
            answer, results = agent.run(f"{proxy}/rollouts/{rollout}/v1", task, str(workdir), api, stream)
            # The check: every command the agent ran succeeded and it gave a final answer.
            ok = answer is not None and all(r["exit_code"] == 0 for r in results)
            finish(proxy, rollout, "success" if ok else "failure", 1.0 if ok else 0.0,
                   {"task": task, "api": api, "stream": stream, "tool_calls": len(results),
                    "seconds": round(time.time() - start_t, 3)})
            print(f"{rollout:<12} {api:<9} stream={str(stream):<5} tools={len(results)} reward={1.0 if ok else 0.0}  answer: {answer}")
    finally:
        px.send_signal(signal.SIGTERM)  # publishes every pending shard
        px.wait(timeout=60)
        if up:
            up.kill()
    calls = f"read_parquet('{shards}/calls/*.parquet')"
    rollouts = f"read_parquet('{shards}/rollouts/*.parquet')"
    print("\n== Rollouts ==")
    print(duckdb.sql(f"""
        select r.rollout_id, r.status, r.reward, count(c.call_id) as calls,
               sum(c.prompt_tokens) as prompt_tokens, sum(c.completion_tokens) as completion_tokens
        from {rollouts} r left join {calls} c using (rollout_id)
        group by all order by r.rollout_id"""))
    print("== Calls ==")
    print(duckdb.sql(f"""
        select rollout_id, sequence, wire_api, stream, status, finish_reason,
               json_extract_string(tool_calls, '$[0].function.name') as tool,
               (epoch_us(done_at) - epoch_us(received_at)) / 1000.0 as ms
        from {calls} order by rollout_id, sequence"""))
    print("== Shard files ==")
    for f in sorted(shards.glob("*/*.parquet")):
        print(f"  {f.relative_to(out)}  {f.stat().st_size} bytes")
    print("\n== Transcript of demo-chat-0 (normalized messages of its last call, then the answer) ==")
    msgs, answer = duckdb.sql(f"""
        select messages, response_message from {calls}
        where rollout_id = 'demo-chat-0' order by sequence desc limit 1""").fetchone()
    for m in json.loads(msgs) + [json.loads(answer)]:
        text = m.get("content") or json.dumps(m.get("tool_calls"))
        print(f"  [{m['role']}] {text}")
    print("\n== Datasets (rollcall export sft / rl, rollcall inspect) ==")
    ds = out / "datasets"
    for kind in ("sft", "rl"):
        subprocess.run([a.bin, "export", kind, "--shards", str(shards), "--out", str(ds / kind)], check=True,
                       stdout=subprocess.DEVNULL)
    sft = duckdb.sql(f"select count(*), sum(len(messages)) from read_parquet('{ds}/sft/sft.parquet')").fetchone()
    rl = json.loads((ds / "rl" / "rl_report.json").read_text())
    print(f"  SFT: {sft[0]} conversations, {sft[1]} messages -> {ds / 'sft'}")
    print(f"  RL:  {rl['samples']} token-exact samples ({rl['skipped_no_token_ids']} calls without token ids left out)"
          f" -> {ds / 'rl'}")
    print(subprocess.run([a.bin, "inspect", "--shards", str(shards)], check=True, capture_output=True,
                         text=True).stdout)
    print(f"\nDone in {time.time() - t0:.1f} s. Open the shards with pyarrow, DuckDB or datasets:"
          f"\n  duckdb -c \"select * from read_parquet('{shards}/calls/*.parquet')\"")


if __name__ == "__main__":
    main()
