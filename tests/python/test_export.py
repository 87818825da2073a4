"""Datasets from real shards: multi-turn tool-calling rollouts driven through
the proxy with the openai SDK (a vLLM-kind route, so token ids and logprobs
are recorded, and a plain route without them), finished with rewards and
groups, then `rollcall export sft/rl/orchard`, `import orchard` and
`inspect`, with every output loaded by `datasets`, pyarrow and DuckDB."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

import rollcall_harness as h

import datasets  # noqa: E402  (required: requirements.txt installs it)

AGENT = h.REPO_ROOT / "harness-adapters" / "scripted-agent" / "agent.py"


def load_agent():
    spec = importlib.util.spec_from_file_location("scripted_agent", AGENT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def routes_toml(upstream: str) -> str:
    return f"""
[shards]
max_age_secs = 0.2
[[routes]]
name = "vllm"
url = "{upstream}/v1"
kind = "vllm"
[[routes]]
name = "plain"
url = "{upstream}/v1"
models = ["plain*"]
"""


def cli(*args: str) -> str:
    p = subprocess.run([h.rollcall_bin(), *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"rollcall {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def finish(proxy, rid: str, status: str, reward: float | None, metadata: dict) -> None:
    body = {"status": status, "metadata": metadata}
    if reward is not None:
        body["reward"] = reward
    r = h.post_json(proxy.url, f"/v1/rollouts/{rid}/finish", body)
    assert r.status == 200, r.body


TASK = "Inspect the folder. [[run: echo hello]] [[run: ls /definitely-not-here]]"


@pytest.fixture
def shards(make_proxy, upstream, tmp_path) -> Path:
    """Five rollouts: two scripted-agent runs on the vLLM route (whole and
    streamed; same group, rewards 1 and 0), one on the plain route (no
    token ids), one with a failed call and a compacted history, and one
    that never finished."""
    proxy = make_proxy(toml=routes_toml(upstream))
    agent = load_agent()
    work = tmp_path / "work"
    work.mkdir()
    for rid, stream in [("tok-a", False), ("tok-b", True)]:
        answer, results = agent.run(f"{proxy.url}/rollouts/{rid}/v1", TASK, str(work), api="chat", stream=stream)
        assert answer.startswith("Done."), answer
        assert [r["exit_code"] for r in results] == [0, 2]
    finish(proxy, "tok-a", "success", 1.0, {"group": "task-1", "harness": "scripted-agent"})
    finish(proxy, "tok-b", "failure", 0.0, {"group": "task-1", "harness": "scripted-agent"})

    agent.run(f"{proxy.url}/rollouts/plain-c/v1", TASK, str(work), api="chat", model="plain")
    finish(proxy, "plain-c", "success", 1.0, {"task": "task-2"})

    # A failed call, then a compaction: the history is replaced by a summary.
    c = h.sdk_client(f"{proxy.url}/rollouts/compact/v1")
    u1 = {"role": "user", "content": "first question"}
    a1 = c.chat.completions.create(model="m", messages=[u1]).choices[0].message
    hist = [u1, {"role": "assistant", "content": a1.content}, {"role": "user", "content": "second question"}]
    a2 = c.chat.completions.create(model="m", messages=hist).choices[0].message
    with pytest.raises(Exception):
        c.chat.completions.create(model="scripted@fault=500", messages=hist + [{"role": "assistant", "content": a2.content}])
    summary = [{"role": "user", "content": "Summary: two questions answered. Now a third question"}]
    a3 = c.chat.completions.create(model="m", messages=summary).choices[0].message
    c.chat.completions.create(model="m", messages=summary + [{"role": "assistant", "content": a3.content},
                                                             {"role": "user", "content": "and a fourth"}])
    finish(proxy, "compact", "completed", 0.5, {"group": "task-3"})

    c = h.sdk_client(f"{proxy.url}/rollouts/open-e/v1")
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "never finished"}])
    h.wait_for_shards(proxy.url)
    return proxy.shards


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["sample_id"]: r for r in rows}


def test_exports_load_everywhere(shards, tmp_path):
    calls = h.rows_by_rollout(h.read_calls_arrow(shards))

    # ------------------------------------------------------------ SFT
    out = tmp_path / "sft"
    summary = cli("export", "sft", "--shards", str(shards), "--out", str(out))
    assert "sft:" in summary
    report = json.loads((out / "sft_report.json").read_text())
    assert report["skipped_not_ok"] == 1
    assert report["mismatches"] >= 1
    pq_ds = datasets.load_dataset("parquet", data_files=str(out / "sft.parquet"))["train"]
    js_ds = datasets.load_dataset("json", data_files=str(out / "sft.jsonl"))["train"]
    assert len(pq_ds) == len(js_ds) == report["samples"]
    for col in ["sample_id", "rollout_id", "segment", "messages", "tools", "loss_weights", "reward",
                "status", "model", "harness", "rule"]:
        assert col in pq_ds.column_names and col in js_ds.column_names, col
    rows = by_id(pq_ds.to_list())
    a = rows["tok-a:0"]
    assert [m["role"] for m in a["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert a["loss_weights"] == [1.0 if m["role"] == "assistant" else 0.0 for m in a["messages"]]
    assert a["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    # Arguments and tools come back as the recorded objects (arrow.json columns).
    assert a["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"command": "echo hello"}
    assert a["messages"][3]["tool_call_id"] == a["messages"][2]["tool_calls"][0]["id"]
    assert a["messages"][-1]["content"].startswith("Done.")
    assert a["tools"][0]["function"]["name"] == "bash"
    assert (a["reward"], a["status"], a["harness"], a["rule"], a["model"]) == (1.0, "success", "scripted-agent", "full", "scripted")
    assert rows["tok-b:0"]["reward"] == 0.0
    assert rows["plain-c:0"]["harness"].startswith("OpenAI/Python")
    # The compaction split the rollout; both segments share its reward.
    assert rows["compact:0"]["reward"] == rows["compact:1"]["reward"] == 0.5
    assert rows["compact:1"]["messages"][0]["content"].startswith("Summary:")
    assert rows["open-e:0"]["reward"] is None and rows["open-e:0"]["status"] is None
    # JSONL: tools as a native list, same messages.
    js = by_id(js_ds.to_list())
    assert js["tok-a:0"]["tools"][0]["function"]["name"] == "bash"
    assert [m["content"] for m in js["tok-a:0"]["messages"]] == [m["content"] for m in a["messages"]]
    mism = [json.loads(line) for line in (out / "sft_mismatches.jsonl").read_text().splitlines()]
    comp = [m for m in mism if m["rollout_id"] == "compact"]
    # On the vLLM route the token ids decide: the summary differs right after "<|user|>".
    assert len(comp) == 1 and comp[0]["token_index"] == len(b"<|user|>") and "differs" in comp[0]["reason"]
    assert comp[0]["sequence"] == calls["compact"][3]["sequence"] and comp[0]["previous_sequence"] == 1
    con = duckdb.connect()
    n, msgs = con.execute(f"select count(*), sum(len(messages)) from read_parquet('{out / 'sft.parquet'}')").fetchone()
    assert n == report["samples"] and msgs == sum(len(r["messages"]) for r in rows.values())
    assert con.execute(f"select count(*) from read_json_auto('{out / 'sft.jsonl'}')").fetchone()[0] == n

    # Filters
    f_out = tmp_path / "sft-min"
    cli("export", "sft", "--shards", str(shards), "--out", str(f_out), "--min-reward", "0.75", "--route", "vllm")
    assert [r["sample_id"] for r in pq.read_table(f_out / "sft.parquet").to_pylist()] == ["tok-a:0"]
    f_out = tmp_path / "sft-harness"
    cli("export", "sft", "--shards", str(shards), "--out", str(f_out), "--harness", "scripted-agent",
        "--status", "failure", "--since", "2000-01-01T00:00:00Z", "--until", "2999-01-01T00:00:00Z")
    assert [r["sample_id"] for r in pq.read_table(f_out / "sft.parquet").to_pylist()] == ["tok-b:0"]

    # Credit assignment: tok-b failed; its second command errored.
    t_out = tmp_path / "sft-trunc"
    cli("export", "sft", "--shards", str(shards), "--out", str(t_out), "--truncate-failed", "tool-error")
    t = by_id(pq.read_table(t_out / "sft.parquet").to_pylist())
    assert t["tok-b:0"]["rule"] == "truncated:tool_error"
    assert [m["role"] for m in t["tok-b:0"]["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert t["tok-a:0"]["rule"] == "full" and len(t["tok-a:0"]["messages"]) == 7
    scores = tmp_path / "scores.jsonl"
    seq1 = calls["tok-a"][1]["sequence"]
    scores.write_text(json.dumps({"rollout_id": "tok-a", "sequence": seq1, "score": 0.25}) + "\n")
    s_out = tmp_path / "sft-scores"
    cli("export", "sft", "--shards", str(shards), "--out", str(s_out), "--step-scores", str(scores))
    s = by_id(pq.read_table(s_out / "sft.parquet").to_pylist())
    assert s["tok-a:0"]["rule"] == "step_scores"
    assert s["tok-a:0"]["loss_weights"] == [0.0, 0.0, 1.0, 0.0, 0.25, 0.0, 1.0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"rollout_id": "x", "sequence": 0, "score": 1}\nnot json\n')
    p = subprocess.run([h.rollcall_bin(), "export", "sft", "--shards", str(shards), "--out", str(tmp_path / "x"),
                        "--step-scores", str(bad)], capture_output=True, text=True)
    assert p.returncode != 0 and "line 2" in p.stderr

    # ------------------------------------------------------------ RL
    r_out = tmp_path / "rl"
    cli("export", "rl", "--shards", str(shards), "--out", str(r_out))
    rl_report = json.loads((r_out / "rl_report.json").read_text())
    assert rl_report["skipped_no_token_ids"] == len(calls["plain-c"])
    assert rl_report["missing_logprobs"] == 0
    rl = by_id(datasets.load_dataset("parquet", data_files=str(r_out / "rl.parquet"))["train"].to_list())
    assert not any(k.startswith("plain-c") for k in rl)
    for rid in ["tok-a", "tok-b"]:
        sample, rc = rl[f"{rid}:0"], calls[rid]
        assert len(rc) == 3
        assert sample["group"] == "task-1"
        # Token-exact: prompt + response is the last call's prompt + completion.
        assert sample["prompt_ids"] == list(rc[0]["prompt_token_ids"])
        assert sample["prompt_ids"] == h.scripted_prompt_ids(json.loads(rc[0]["messages"]))
        assert sample["prompt_ids"] + sample["response_ids"] == list(rc[-1]["prompt_token_ids"]) + list(rc[-1]["completion_token_ids"])
        assert len(sample["response_ids"]) == len(sample["loss_mask"]) == len(sample["logprobs"])
        sampled = [lp for lp, m in zip(sample["logprobs"], sample["loss_mask"]) if m == 1]
        recorded = [x for c in rc for x in c["completion_logprobs"]]
        assert sampled == pytest.approx(recorded)
        assert sum(sample["loss_mask"]) == sum(len(c["completion_token_ids"]) for c in rc)
        assert all(lp == 0.0 for lp, m in zip(sample["logprobs"], sample["loss_mask"]) if m == 0)
    assert rl["tok-a:0"]["reward"] == 1.0 and rl["tok-b:0"]["reward"] == 0.0
    assert rl["compact:0"]["group"] == rl["compact:1"]["group"] == "task-3"
    assert rl["compact:0"]["sequences"] == [calls["compact"][0]["sequence"], calls["compact"][1]["sequence"]]
    ok = duckdb.sql(f"select bool_and(len(response_ids) = len(loss_mask) and len(loss_mask) = len(logprobs)) "
                    f"from read_parquet('{r_out / 'rl.parquet'}')").fetchone()[0]
    assert ok

    shapes = {
        "verl": ["prompt_ids", "response_ids", "response_mask", "response_logprobs", "reward_score",
                 "num_turns", "metrics", "extra_fields"],
        "slime": ["group_index", "index", "rollout_id", "tokens", "response_length", "loss_mask",
                  "rollout_log_probs", "reward", "status", "metadata"],
        "trl": ["prompt_ids", "completion_ids", "env_mask", "logprobs", "reward"],
    }
    for trainer, cols in shapes.items():
        o = tmp_path / f"rl-{trainer}"
        cli("export", "rl", "--shards", str(shards), "--out", str(o), "--trainer", trainer,
            "--missing-reward", "zero")
        d = datasets.load_dataset("parquet", data_files=str(o / "rl.parquet"))["train"]
        assert set(cols) <= set(d.column_names), (trainer, d.column_names)
        sid = {"verl": lambda r: r["extra_fields"]["sample_id"],
               "slime": lambda r: r["metadata"]["sample_id"]}.get(trainer, lambda r: r["sample_id"])
        got = {sid(r): r for r in d.to_list()}
        row = got["tok-a:0"]
        if trainer == "slime":
            assert row["tokens"] == rl["tok-a:0"]["prompt_ids"] + rl["tok-a:0"]["response_ids"]
            assert row["response_length"] == len(rl["tok-a:0"]["response_ids"])
            assert got["tok-b:0"]["group_index"] == row["group_index"]
            assert row["status"] == "completed" and got["open-e:0"]["status"] == "aborted"
            assert got["compact:0"]["rollout_id"] == got["compact:1"]["rollout_id"] != row["rollout_id"]
        elif trainer == "verl":
            assert row["extra_fields"]["uid"] == "task-1" and row["response_mask"] == rl["tok-a:0"]["loss_mask"]
            assert row["reward_score"] == 1.0 and got["open-e:0"]["reward_score"] == 0.0
        else:
            assert row["completion_ids"] == rl["tok-a:0"]["response_ids"]
            assert row["env_mask"] == rl["tok-a:0"]["loss_mask"]

    # ------------------------------------------------------------ Orchard
    o_out = tmp_path / "orchard"
    cli("export", "orchard", "--shards", str(shards), "--out", str(o_out))
    orch = datasets.load_dataset("parquet", data_files=str(o_out / "orchard.parquet"))["train"]
    assert orch.column_names == ["messages", "tools", "metadata"]
    metas = {json.loads(m)["rollout_id"] + ":" + str(json.loads(m)["segment"]): json.loads(m) for m in orch["metadata"]}
    assert metas["tok-a:0"]["verify_status"] == "success" and metas["tok-b:0"]["verify_status"] == "failure"
    assert metas["tok-a:0"]["group"] == "task-1"
    imported = tmp_path / "imported"
    out_text = cli("import", "orchard", "--in", str(o_out / "orchard.parquet"), "--shards", str(imported))
    assert f"imported {len(orch)} rollouts" in out_text
    i_out = tmp_path / "from-orchard"
    cli("export", "sft", "--shards", str(imported), "--out", str(i_out))
    back = by_id(pq.read_table(i_out / "sft.parquet").to_pylist())
    assert [m["content"] for m in back["tok-a:0"]["messages"]] == [m["content"] for m in a["messages"]]
    assert back["tok-a:0"]["reward"] == 1.0 and back["tok-b:0"]["reward"] == 0.0
    assert json.loads((i_out / "sft_report.json").read_text())["mismatches"] == 0
    # JSONL in, too.
    jl = tmp_path / "orchard.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in orch.to_list()))
    cli("import", "orchard", "--in", str(jl), "--shards", str(tmp_path / "imported-jsonl"))
    assert len(h.read_rollouts_arrow(tmp_path / "imported-jsonl")) == len(orch)

    # ------------------------------------------------------------ inspect
    s = json.loads(cli("inspect", "--shards", str(shards), "--json"))
    assert s["rollouts"] == 5 and s["finished"] == 4
    assert s["calls"] == sum(len(v) for v in calls.values())
    assert s["failures_by_class"] == {"upstream_server_error": 1}
    assert s["rewards"]["values"] == {"0": 1, "0.5": 1, "1": 2}
    assert s["mismatches"] >= 1 and s["calls_with_token_ids"] > 0
    text = cli("inspect", "--shards", str(shards))
    assert "rollouts" in text and "mismatches" in text
    t = cli("inspect", "--shards", str(shards), "--rollout", "compact")
    assert "segment 1" in t and "differs from call" in t and "failed: upstream_server_error" in t
    t = cli("inspect", "--shards", str(shards), "--rollout", "tok-a")
    assert "→ bash(" in t and "[tool call_" in t


def test_exports_are_deterministic(shards, tmp_path):
    runs = []
    for n in range(2):
        base = tmp_path / f"run{n}"
        cli("export", "sft", "--shards", str(shards), "--out", str(base / "sft"))
        cli("export", "rl", "--shards", str(shards), "--out", str(base / "rl"), "--trainer", "slime")
        cli("export", "orchard", "--shards", str(shards), "--out", str(base / "orchard"))
        runs.append({str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()})
    assert runs[0].keys() == runs[1].keys() and len(runs[0]) >= 9
    for k in runs[0]:
        assert runs[0][k] == runs[1][k], f"{k} differs between runs"


def test_errors_are_clear(tmp_path):
    p = subprocess.run([h.rollcall_bin(), "export", "sft", "--shards", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "does not exist" in p.stderr
    (tmp_path / "empty").mkdir()
    p = subprocess.run([h.rollcall_bin(), "export", "rl", "--shards", str(tmp_path / "empty"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "no shards" in p.stderr


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (h.REPO_ROOT / "fixtures").glob("*/exchange.jsonl")))
def test_real_harness_exchanges_rebuild_into_segments(name, tmp_path):
    """Each fixture is a real multi-turn exchange of a harness (Codex on
    Responses; Claude Code on Messages; opencode, OpenClaw, ZeroClaw,
    mini-swe-agent on Chat Completions), replayed through the proxy. Codex, ZeroClaw and
    mini-swe-agent extend their history call by call: one conversation, no
    mismatch. opencode's first call is its title generator: a side call by
    its adapter's rule, marked on its row and left out of the export (with
    --include-side-calls it is its own segment, while the agent's two calls
    form one). OpenClaw keeps an
    internal-context user message last, after the new turns, so its history
    is edited: a new segment, reported at message 2."""
    import http.client
    from urllib.parse import urlparse

    import test_fixtures as tf

    exchanges = tf.load(name)
    replay = tf.Replay(exchanges)
    try:
        proxy = h.start_proxy(tmp_path / "p", replay.url, toml=h.TWO_ROUTES_TOML.format(upstream=replay.url))
        u = urlparse(proxy.url)
        for e in exchanges:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            headers = {"Content-Type": "application/json"}
            if e["user_agent"]:
                headers["User-Agent"] = e["user_agent"]
            conn.request("POST", f"/rollouts/{name}{e['path']}", body=e["request"].encode(), headers=headers)
            assert conn.getresponse().read() is not None
            conn.close()
        h.wait_for_shards(proxy.url)
        side = [r["sequence"] for r in h.duck_dicts(proxy.shards, "SELECT sequence, side_call FROM t")
                if r["side_call"]]
        assert side == ([0] if name == "opencode" else []), side
        out = tmp_path / "sft"
        cli("export", "sft", "--shards", str(proxy.shards), "--out", str(out),
            *(["--include-side-calls"] if name == "opencode" else []))
        mism = [json.loads(line) for line in (out / "sft_mismatches.jsonl").read_text().splitlines()]
        rows = pq.read_table(out / "sft.parquet").to_pylist()
        expected = {
            "opencode": ([[0], [1, 2]], [(1, 0, "system content differs")]),
            "openclaw": ([[0], [1]], [(1, 2, "role differs")]),
        }.get(name, ([list(range(len(exchanges)))], []))
        assert [r["sequences"] for r in rows] == expected[0]
        assert len(mism) == len(expected[1])
        for m, (seq, idx, why) in zip(mism, expected[1]):
            assert (m["sequence"], m["message_index"]) == (seq, idx) and why in m["reason"], m
        for r in rows:
            msgs = r["messages"]
            assert msgs[-1]["role"] == "assistant"
            assert r["loss_weights"] == [1.0 if m["role"] == "assistant" else 0.0 for m in msgs]
        main = rows[-1]["messages"]
        assert sum(1 for m in main if m["role"] == "assistant") >= len(rows[-1]["sequences"])
        if name == "opencode":
            # By default the side call is left out: one conversation, no mismatch.
            plain = tmp_path / "sft-plain"
            cli("export", "sft", "--shards", str(proxy.shards), "--out", str(plain))
            assert [r["sequences"] for r in pq.read_table(plain / "sft.parquet").to_pylist()] == [[1, 2]]
            assert (plain / "sft_mismatches.jsonl").read_text().strip() == ""
        proxy.kill()
    finally:
        replay.close()
