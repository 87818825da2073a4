"""The recipes on recorded data (docs/recipes.md), against real components:

- `rollcall score`: the embedded engine as the teacher of calls the proxy
  recorded from the same engine, its logprobs checked against transformers'
  forward pass over the same ids; the scores read back by pyarrow and
  DuckDB, carried by `export rl` under the loss mask, kept across a re-run
  and a re-export; a teacher with another vocabulary refused, over HTTP,
  from `rollcall model serve`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rollcall_harness as h

import torch  # noqa: E402  (required: make test installs it)
import transformers  # noqa: E402

EMBEDDED_TOML = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "smol"
kind = "embedded"
[routes.embedded]
model_file = "{model}"
default_max_tokens = 16
default_temperature = 0.7
"""

QUESTIONS = {
    "opd-1": "What is the capital of France? Answer in one sentence.",
    "opd-2": "Name three colours of the rainbow, please.",
}


@pytest.fixture(scope="module")
def hf(gguf):
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    return tok, model


@pytest.fixture(scope="module")
def recorded(gguf, tmp_path_factory):
    """Two finished two-turn rollouts recorded from the embedded model: the
    shards directory."""
    d = tmp_path_factory.mktemp("recorded")
    p = h.start_proxy(d, "unused", toml=EMBEDDED_TOML.format(model=gguf))
    try:
        for rid, question in QUESTIONS.items():
            messages = [{"role": "user", "content": question}]
            for follow_up in ["Now say it again in other words.", None]:
                r = h.post_json(p.url, f"/rollouts/{rid}/v1/chat/completions",
                                {"model": "smol", "messages": messages, "seed": 3}, timeout=300)
                assert r.status == 200, r.body
                if follow_up:
                    answer = r.json()["choices"][0]["message"]["content"]
                    messages = messages + [{"role": "assistant", "content": answer},
                                           {"role": "user", "content": follow_up}]
            r = h.post_json(p.url, f"/v1/rollouts/{rid}/finish", {"status": "success", "reward": 1.0})
            assert r.status == 200, r.body
        h.wait_for_shards(p.url)
    finally:
        p.terminate()
    return p.shards


def score(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([h.rollcall_bin(), "score", *args], capture_output=True, text=True, timeout=900)


def scores_table(shards: Path) -> list[dict]:
    return pq.read_table(shards / "scores").to_pylist()


def test_embedded_teacher_scores_match_a_forward_pass(recorded, gguf, hf):
    _, model = hf
    r = score("--teacher", "embedded", "--model-file", str(gguf), "--shards", str(recorded), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["scored"] == 4 and report["failed"] == 0, report
    assert report["teacher"] == f"embedded:{gguf.name}"
    calls = {(c["rollout_id"], c["sequence"]): c for c in h.read_calls_arrow(recorded)}
    rows = scores_table(recorded)
    assert len(rows) == 4 and {r["rollout_id"] for r in rows} == set(QUESTIONS)
    for s in rows:
        c = calls[(s["rollout_id"], s["sequence"])]
        prompt, completion = c["prompt_token_ids"], c["completion_token_ids"]
        assert s["prompt_tokens"] == len(prompt)
        assert len(s["teacher_logprobs"]) == len(completion) > 0
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0]
        lp = torch.log_softmax(logits.double(), dim=-1)
        for i, (tid, got) in enumerate(zip(completion, s["teacher_logprobs"])):
            want = lp[len(prompt) - 1 + i][tid].item()
            assert abs(got - want) < 2e-3, (s["rollout_id"], s["sequence"], i, got, want)
    # DuckDB reads the scores beside the calls.
    joined = h.duck(recorded, "select count(*) from read_parquet('{dir}/scores/*.parquet') s "
                    "join read_parquet('{dir}/calls/*.parquet') c using (rollout_id, sequence) "
                    "where len(s.teacher_logprobs) = len(c.completion_token_ids)".replace("{dir}", str(recorded)))
    assert joined == [(4,)]

    # A second run scores nothing again.
    again = score("--teacher", "embedded", "--model-file", str(gguf), "--shards", str(recorded), "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["scored"] == 0 and report["already_scored"] == 4, report
    assert len(scores_table(recorded)) == 4


def test_the_rl_export_carries_teacher_logprobs_under_the_loss_mask(recorded, gguf, tmp_path):
    if not (recorded / "scores").exists():
        r = score("--teacher", "embedded", "--model-file", str(gguf), "--shards", str(recorded))
        assert r.returncode == 0, r.stderr
    by_call = {(s["rollout_id"], s["sequence"]): s["teacher_logprobs"] for s in scores_table(recorded)}
    for trainer, column in [("generic", "teacher_logprobs"), ("slime", "teacher_log_probs"),
                            ("trl", "teacher_logprobs"), ("verl", None)]:
        for attempt in range(2):  # exported twice: the scores are read again each time
            out = tmp_path / f"{trainer}-{attempt}"
            r = subprocess.run([h.rollcall_bin(), "export", "rl", "--shards", str(recorded), "--out", str(out),
                                "--trainer", trainer], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            samples = pq.read_table(out / "rl.parquet").to_pylist()
            assert samples
            for s in samples:
                meta = s.get("metadata") or s.get("extra_fields") or s
                if trainer == "verl":
                    teacher, mask = s["extra_fields"]["teacher_logprobs"], s["response_mask"]
                else:
                    teacher = s[column]
                    mask = s.get("loss_mask") or s.get("env_mask")
                rid = meta["rollout_id"]
                assert teacher is not None and len(teacher) == len(mask)
                sampled = [t for t, m in zip(teacher, mask) if m == 1]
                want = [lp for seq in meta["sequences"] for lp in by_call[(rid, seq)]]
                assert len(sampled) == len(want)
                assert all(abs(a - b) < 1e-5 for a, b in zip(sampled, want))
                assert all(t == 0.0 for t, m in zip(teacher, mask) if m == 0)


@pytest.fixture(scope="module")
def other_vocabulary(gguf, tmp_path_factory):
    """A Hugging Face checkpoint of the same model whose tokenizer gives the
    ids other strings: its vocabulary is not the student's."""
    out = tmp_path_factory.mktemp("other-vocab") / "ckpt"
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    spec = json.loads((out / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    special = {t["content"] for t in spec.get("added_tokens", [])}
    ordinary = sorted((i, t) for t, i in vocab.items() if t not in special)
    ids = [i for i, _ in ordinary]
    # Reverse the ordinary tokens' ids: the same strings, other numbers.
    for (_, t), new in zip(ordinary, reversed(ids)):
        vocab[t] = new
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


def test_a_teacher_with_another_vocabulary_is_refused(recorded, other_vocabulary, tmp_path):
    served = h.Proc(["model", "serve", "--listen", "127.0.0.1:0", "--model-file", str(other_vocabulary)],
                    "embedded model listening on ", tmp_path / "teacher.stderr")
    try:
        before = len(h.shard_files(recorded, "scores"))
        r = score("--teacher", f"{served.url}/v1", "--shards", str(recorded))
        assert r.returncode != 0
        assert "has another vocabulary than the student's" in r.stderr, r.stderr
        assert len(h.shard_files(recorded, "scores")) == before
    finally:
        served.kill()
