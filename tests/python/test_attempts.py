"""Retries are retries: the real `openai` and `anthropic` SDKs retry a call
the upstream answered 500 or 429 (the scripted server fails each body only
the first time: `fault_times=1`). rollcall records the retry as another
attempt of the same call, not as a new turn, and the datasets use the last
successful attempt."""

from __future__ import annotations

import json
import subprocess

import anthropic
import openai
import pyarrow.parquet as pq

import rollcall_harness as h


def rows(proxy) -> list[dict]:
    h.wait_for_shards(proxy.url)
    return h.duck_dicts(proxy.shards, "SELECT rollout_id, sequence, status, http_status, attempt, attempt_of "
                                      "FROM t ORDER BY rollout_id, sequence")


def test_sdk_retries_are_attempts_of_one_call(proxy, tmp_path):
    oa = openai.OpenAI(base_url=f"{proxy.url}/rollouts/oa/v1", api_key="x", max_retries=2)
    r = oa.chat.completions.create(model="m@fault=500@fault_times=1",
                                   messages=[{"role": "user", "content": "first turn"}])
    assert r.choices[0].message.content
    r2 = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "first turn"},
                                                        {"role": "assistant", "content": r.choices[0].message.content},
                                                        {"role": "user", "content": "second turn"}])
    assert r2.choices[0].message.content
    an = anthropic.Anthropic(base_url=f"{proxy.url}/rollouts/an", api_key="x", max_retries=2)
    m = an.messages.create(model="claude-x@fault=429@fault_times=1", max_tokens=32,
                           messages=[{"role": "user", "content": "hello"}])
    assert m.content
    by: dict[str, list[dict]] = {}
    for row in rows(proxy):
        by.setdefault(row["rollout_id"], []).append(row)
    oa_rows = by["oa"]
    assert [(x["sequence"], x["status"], x["http_status"], x["attempt"], x["attempt_of"]) for x in oa_rows] == [
        (0, "failed", 500, 0, None),
        (1, "ok", 200, 1, 0),
        (2, "ok", 200, 0, None),
    ], oa_rows
    an_rows = by["an"]
    assert [(x["status"], x["http_status"], x["attempt"], x["attempt_of"]) for x in an_rows] == [
        ("failed", 429, 0, None),
        ("ok", 200, 1, 0),
    ], an_rows

    # The SFT export sees two turns for `oa`, not three: the retry is the call.
    out = tmp_path / "sft"
    subprocess.run([h.rollcall_bin(), "export", "sft", "--shards", str(proxy.shards), "--out", str(out)],
                   check=True, capture_output=True)
    report = json.loads((out / "sft_report.json").read_text())
    # The failed first attempts were superseded, not skipped as failed turns.
    assert report["skipped_not_ok"] == 0, report
    seqs = {r["rollout_id"]: r["sequences"] for r in pq.read_table(out / "sft.parquet").to_pylist()}
    assert seqs["oa"] == [1, 2] and seqs["an"] == [1], seqs
