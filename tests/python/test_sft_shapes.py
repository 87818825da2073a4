"""SFT shapes (issue 12): tools and tool-call arguments typed `arrow.json`
so `datasets` decodes each row on its own, `--arguments object|string`, the
token-exact `sft_tokens.parquet`, and `--trainer verl` (native nested
columns, one file per Arrow type), each loaded the way its consumer loads it
and compared with what the calls recorded, exactly (no keys added)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datasets
import rollcall_harness as h
import test_export as te


def cli(*args: str) -> str:
    p = subprocess.run([h.rollcall_bin(), *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"rollcall {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def strict_eq(a, b) -> bool:
    """Equal with the same types (1 is not 1.0), the same keys in the same order."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(strict_eq(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def fn_tool(name: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": props, "required": required}}}


BASH = fn_tool("bash", {"command": {"type": "string", "description": "a shell command"}}, ["command"])
WRITE = fn_tool("write", {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}},
                ["path", "content"])


def tc(i: str, name: str, args) -> dict:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": args}}


def conv(*steps) -> list[dict]:
    """user task, then per step an assistant turn with tool calls and their results, then a final answer."""
    msgs = [{"role": "system", "content": "you are terse"}, {"role": "user", "content": "do the task"}]
    for calls in steps:
        msgs.append({"role": "assistant", "content": "", "tool_calls": calls})
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": f"ran {c['function']['name']}"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


# rollout id -> (messages, tools)
ROWS = {
    # Tool set 1, one argument shape.
    "bash-only": (conv([tc("a1", "bash", '{"command": "ls"}')], [tc("a2", "bash", '{"command":"cat a.txt"}')]), [BASH]),
    # Tool set 2 (other keys, an integer): a different Arrow type for tools.
    "write-only": (conv([tc("b1", "write", '{"path": "a.txt", "content": "hi", "mode": 420}')]), [WRITE]),
    # Two argument shapes in one row (and one that is not JSON): arguments as strings for verl.
    "two-shapes": (conv([tc("c1", "write", '{"path": "a.txt", "content": "x"}')],
                        [tc("c2", "write", '{"path": "b.txt", "mode": 384}'), tc("c3", "write", "not json {")]), [WRITE]),
    # Two tools whose parameters differ: no exact native form for verl.
    "both-tools": (conv([tc("d1", "bash", '{"command": "pwd"}')]), [BASH, WRITE]),
    # No tools at all.
    "chat": ([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}], None),
}


@pytest.fixture
def imported(tmp_path) -> Path:
    src = tmp_path / "rows.jsonl"
    with src.open("w") as f:
        for rid, (msgs, tools) in ROWS.items():
            row = {"messages": msgs, "metadata": {"rollout_id": rid, "verify_status": "success"}}
            if tools is not None:
                row["tools"] = tools
            f.write(json.dumps(row) + "\n")
    shards = tmp_path / "shards"
    cli("import", "orchard", "--in", str(src), "--shards", str(shards))
    return shards


def recorded_tools(shards: Path) -> dict[str, str | None]:
    """The `tools` text of each rollout's last call, as the shard holds it."""
    calls = h.rows_by_rollout(h.read_calls_arrow(shards))
    return {rid: rows[-1]["tools"] for rid, rows in calls.items()}


def parsed_args(s: str):
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return s


def expected_messages(rid: str, args: str = "object") -> list[dict]:
    """The exported form of a row's messages: every key present, content a string."""
    out = []
    for m in ROWS[rid][0]:
        calls = m.get("tool_calls")
        out.append({
            "role": m["role"],
            "content": m.get("content") or "",
            "tool_calls": None if not calls else [
                {"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"],
                    "arguments": parsed_args(c["function"]["arguments"]) if args == "object" else c["function"]["arguments"]}}
                for c in calls],
            "tool_call_id": m.get("tool_call_id"),
            "reasoning_content": None,
        })
    return out


def test_tools_and_arguments_decode_per_row_in_datasets(imported, tmp_path):
    out = tmp_path / "sft"
    cli("export", "sft", "--shards", str(imported), "--out", str(out))
    report = json.loads((out / "sft_report.json").read_text())
    assert (report["arguments"], report["trainer"]) == ("object", "generic")
    assert report["arguments_not_json"] == 1
    assert report["samples"] == len(ROWS)
    # No call has token ids: no sft_tokens.parquet.
    assert report["token_samples"] == 0 and not (out / "sft_tokens.parquet").exists()
    assert report["samples_without_token_ids"] == len(ROWS)

    schema = pq.read_schema(out / "sft.parquet")
    assert schema.field("tools").type == pa.json_()
    fn = schema.field("messages").type.value_type.field("tool_calls").type.value_type.field("function").type
    assert fn.field("arguments").type == pa.json_()

    # pyarrow: the tools text is exactly what the call recorded.
    rec = recorded_tools(imported)
    table = pq.read_table(out / "sft.parquet")
    for row in table.to_pylist():
        assert row["tools"] == rec[row["rollout_id"]], row["rollout_id"]

    # datasets: one Json feature per column, decoded row by row, nothing merged.
    ds = datasets.load_dataset("parquet", data_files=str(out / "sft.parquet"))["train"]
    assert isinstance(ds.features["tools"], datasets.Json)
    rows = {r["rollout_id"]: r for r in ds.to_list()}
    assert set(rows) == set(ROWS)
    for rid, (msgs, tools) in ROWS.items():
        got = rows[rid]
        assert strict_eq(got["tools"], tools), (rid, got["tools"])
        assert strict_eq(got["messages"], expected_messages(rid)), (rid, got["messages"])
    # The first bash call keeps its own keys; the write call its own.
    assert rows["two-shapes"]["messages"][4]["tool_calls"][0]["function"]["arguments"] == {"path": "b.txt", "mode": 384}
    assert rows["two-shapes"]["messages"][4]["tool_calls"][1]["function"]["arguments"] == "not json {"

    # JSONL: native objects, per line.
    js = {r["rollout_id"]: r for r in map(json.loads, (out / "sft.jsonl").read_text().splitlines())}
    for rid, (msgs, tools) in ROWS.items():
        assert strict_eq(js[rid]["tools"], tools) and strict_eq(js[rid]["messages"], expected_messages(rid)), rid


def test_arguments_as_strings(imported, tmp_path):
    out = tmp_path / "sft"
    cli("export", "sft", "--shards", str(imported), "--out", str(out), "--arguments", "string")
    assert json.loads((out / "sft_report.json").read_text())["arguments"] == "string"
    fn = pq.read_schema(out / "sft.parquet").field("messages").type.value_type.field("tool_calls").type.value_type.field("function").type
    assert fn.field("arguments").type == pa.string()
    ds = datasets.load_dataset("parquet", data_files=str(out / "sft.parquet"))["train"]
    rows = {r["rollout_id"]: r for r in ds.to_list()}
    for rid in ROWS:
        assert strict_eq(rows[rid]["messages"], expected_messages(rid, "string")), rid
    js = {r["rollout_id"]: r for r in map(json.loads, (out / "sft.jsonl").read_text().splitlines())}
    assert js["bash-only"]["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'


def convert_nested_value_to_list_recursive(data_item):
    """As verl 0.9.1's verl/utils/dataset/multiturn_sft_dataset.py."""
    if isinstance(data_item, dict):
        return {k: convert_nested_value_to_list_recursive(v) for k, v in data_item.items()}
    elif isinstance(data_item, list):
        return [convert_nested_value_to_list_recursive(elem) for elem in data_item]
    elif isinstance(data_item, np.ndarray):
        return convert_nested_value_to_list_recursive(data_item.tolist())
    else:
        return data_item


def verl_read(files: list[Path]) -> pd.DataFrame:
    """What MultiTurnSFTDataset reads: pd.read_parquet per file (pyarrow dtypes), pd.concat."""
    df = pd.concat([pd.read_parquet(f, dtype_backend="pyarrow") for f in files])
    df = df.assign(messages=df["messages"].apply(convert_nested_value_to_list_recursive),
                   tools=df["tools"].apply(convert_nested_value_to_list_recursive))
    return df


def test_verl_files_read_back_exactly(imported, tmp_path):
    out = tmp_path / "verl-out"
    summary = cli("export", "sft", "--shards", str(imported), "--out", str(out), "--trainer", "verl")
    report = json.loads((out / "sft_report.json").read_text())
    files = sorted((out / "verl").glob("sft-*.parquet"))
    assert [f"verl/{f.name}" for f in files] == [f for f in report["files"] if f.startswith("verl/")]
    assert not (out / "sft.parquet").exists() and "verl/sft-00000.parquet" in summary
    # bash-only, write-only, two-shapes (strings) and chat each have their own type.
    assert report["verl_files"] == len(files) == 4
    assert report["verl_samples"] == 4 and report["verl_skipped"] == 1
    assert report["verl_arguments_as_string"] == 1
    for f in files:
        t = pq.read_schema(f)
        assert not pa.types.is_string(t.field("messages").type), f
        assert "arrow.json" not in str(t), f

    df = verl_read(files)
    rec = recorded_tools(imported)
    got = {sid: (m, t) for sid, m, t in zip(df["sample_id"], df["messages"], df["tools"])}
    assert set(got) == {f"{rid}:0" for rid in ROWS if rid != "both-tools"}
    for rid, (msgs, tools) in ROWS.items():
        if rid == "both-tools":
            continue
        m, t = got[f"{rid}:0"]
        want = expected_messages(rid, "string" if rid == "two-shapes" else "object")
        assert strict_eq(m, want), (rid, m)
        if tools is None:
            assert t == [], (rid, t)  # an empty list: pandas would turn a null into pd.NA
        else:
            assert strict_eq(t, json.loads(rec[rid])) and strict_eq(t, tools), (rid, t)
    # Native objects: the argument is a dict, the integer an int.
    m, _ = got["write-only:0"]
    assert m[2]["tool_calls"][0]["function"]["arguments"] == {"path": "a.txt", "content": "hi", "mode": 420}
    assert type(got["write-only:0"][1][0]["function"]["parameters"]["properties"]["mode"]) is dict

    # The generic files are what a second export writes; verl parts of an
    # earlier, larger export do not survive a smaller one.
    (out / "verl" / "sft-00009.parquet").write_bytes(b"stale")
    cli("export", "sft", "--shards", str(imported), "--out", str(out), "--trainer", "verl")
    assert sorted((out / "verl").glob("sft-*.parquet")) == files


def test_token_exact_samples(make_proxy, upstream, tmp_path):
    proxy = make_proxy(toml=te.routes_toml(upstream))
    agent = te.load_agent()
    work = tmp_path / "work"
    work.mkdir()
    for rid in ["tok-a", "tok-b"]:
        answer, _ = agent.run(f"{proxy.url}/rollouts/{rid}/v1", te.TASK, str(work), api="chat")
        assert answer.startswith("Done."), answer
    te.finish(proxy, "tok-a", "success", 1.0, {"group": "task-1"})
    te.finish(proxy, "tok-b", "failure", 0.0, {"group": "task-1"})
    agent.run(f"{proxy.url}/rollouts/plain-c/v1", te.TASK, str(work), api="chat", model="plain")
    h.wait_for_shards(proxy.url)
    calls = h.rows_by_rollout(h.read_calls_arrow(proxy.shards))

    scores = tmp_path / "scores.jsonl"
    scores.write_text(json.dumps({"rollout_id": "tok-a", "sequence": calls["tok-a"][1]["sequence"], "score": 0.25}) + "\n")
    out = tmp_path / "sft"
    cli("export", "sft", "--shards", str(proxy.shards), "--out", str(out), "--step-scores", str(scores))
    report = json.loads((out / "sft_report.json").read_text())
    assert "sft_tokens.parquet" in report["files"]
    assert report["token_samples"] == 2
    assert report["skipped_no_token_ids"] == len(calls["plain-c"])
    assert report["samples_without_token_ids"] == 1

    schema = pq.read_schema(out / "sft_tokens.parquet")
    assert schema.field("input_ids").type == pa.list_(pa.int64())
    assert schema.field("assistant_masks").type == pa.list_(pa.int32())
    assert schema.field("token_weights").type == pa.list_(pa.float32())
    ds = datasets.load_dataset("parquet", data_files=str(out / "sft_tokens.parquet"))["train"]
    rows = {r["sample_id"]: r for r in ds.to_list()}
    assert set(rows) == {"tok-a:0", "tok-b:0"}

    for rid in ["tok-a", "tok-b"]:
        rc, r = calls[rid], rows[f"{rid}:0"]
        # Rebuilt here from the recorded ids: prompt, then per call the
        # observation tokens (0) and the completion (1).
        ids, mask, who = list(rc[0]["prompt_token_ids"]), [0] * len(rc[0]["prompt_token_ids"]), [None] * len(rc[0]["prompt_token_ids"])
        for c in rc:
            obs = list(c["prompt_token_ids"])[len(ids):]
            ids += obs + list(c["completion_token_ids"])
            mask += [0] * len(obs) + [1] * len(c["completion_token_ids"])
            who += [None] * len(obs) + [c["sequence"]] * len(c["completion_token_ids"])
        assert ids == list(rc[-1]["prompt_token_ids"]) + list(rc[-1]["completion_token_ids"])
        assert r["input_ids"] == ids and r["assistant_masks"] == mask
        assert r["sequences"] == [c["sequence"] for c in rc] and r["group"] == "task-1"
        scored = rc[1]["sequence"] if rid == "tok-a" else None
        want = [0.0 if s is None else (0.25 if s == scored else 1.0) for s in who]
        assert r["token_weights"] == want
        assert r["rule"] == ("step_scores" if rid == "tok-a" else "full")
    assert (rows["tok-a:0"]["reward"], rows["tok-b:0"]["reward"]) == (1.0, 0.0)

    # --truncate-failed: tok-b failed and its second command errored; the
    # sample ends with the completion of the call that issued that command.
    t_out = tmp_path / "sft-trunc"
    cli("export", "sft", "--shards", str(proxy.shards), "--out", str(t_out), "--truncate-failed", "tool-error")
    t = {r["sample_id"]: r for r in pq.read_table(t_out / "sft_tokens.parquet").to_pylist()}
    b = calls["tok-b"]
    assert t["tok-b:0"]["input_ids"] == list(b[1]["prompt_token_ids"]) + list(b[1]["completion_token_ids"])
    assert t["tok-b:0"]["sequences"] == [b[0]["sequence"], b[1]["sequence"]]
    assert t["tok-b:0"]["rule"] == "truncated:tool_error"
    assert t["tok-a:0"]["rule"] == "full" and len(t["tok-a:0"]["input_ids"]) == len(rows["tok-a:0"]["input_ids"])
    assert json.loads((t_out / "sft_report.json").read_text())["token_truncated"] == 1
    sft_rows = {r["sample_id"]: r for r in pq.read_table(t_out / "sft.parquet").to_pylist()}
    assert sft_rows["tok-b:0"]["rule"] == "truncated:tool_error"

    # Byte-identical across runs, every file.
    again = tmp_path / "sft-again"
    cli("export", "sft", "--shards", str(proxy.shards), "--out", str(again), "--step-scores", str(scores))
    names = sorted(p.name for p in out.iterdir() if p.is_file())
    assert names == sorted(p.name for p in again.iterdir() if p.is_file())
    for n in names:
        assert (out / n).read_bytes() == (again / n).read_bytes(), n
    for trainer_out in [tmp_path / "v1", tmp_path / "v2"]:
        cli("export", "sft", "--shards", str(proxy.shards), "--out", str(trainer_out), "--trainer", "verl")
    v1 = {p.relative_to(tmp_path / "v1"): p.read_bytes() for p in sorted((tmp_path / "v1").rglob("*")) if p.is_file()}
    v2 = {p.relative_to(tmp_path / "v2"): p.read_bytes() for p in sorted((tmp_path / "v2").rglob("*")) if p.is_file()}
    assert v1 == v2 and any(str(k).startswith("verl/") for k in v1)
    assert not math.isnan(rows["tok-a:0"]["token_weights"][-1])
