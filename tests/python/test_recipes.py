"""The recipes on recorded data (docs/recipes.md), against real components:

- `rollcall score`: the embedded engine as the teacher of calls the proxy
  recorded from the same engine, its logprobs checked against transformers'
  forward pass over the same ids; the scores read back by pyarrow and
  DuckDB, carried by `export rl` under the loss mask, kept across a re-run
  and a re-export; a teacher with another vocabulary refused, over HTTP,
  from `rollcall model serve`.
- `rollcall judge`: the scripted model server as a judge whose verdicts
  are known (`[[answer: ...]]`), so the rewards R' = R_base + 0.5 J are
  checked exactly, with their provenance and the exports' choice of
  revision; a user's rubric file; the embedded engine as the judge, whose
  unparseable answers count as J = 0. (`rollcall reward`'s modes run on a
  real batch in test_batch.py.)
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
    tok, model = h.plain_model_from_gguf(gguf)
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


# ---------------------------------------------------------------- the judge

SWE_RUBRIC = h.REPO_ROOT / "proxy-config" / "rubrics" / "swe.toml"
WEIGHTS = {"R1": .15, "R2": .18, "R3": .12, "R4": .15, "R5": .14, "R6": .12, "R7": .14}
SCORES = {"R1": 1.0, "R2": 0.5, "R3": 0.2, "R4": 0.8, "R5": 0.0, "R6": 1.0, "R7": 0.9}
VERDICT = json.dumps({"reasoning": "Reproduced, fixed, verified.", "scores": SCORES})


def grade_meta(task: str, resolved: bool) -> dict:
    """Finish metadata in the shape `rollcall batch` writes."""
    f2p = ["tests/test_core.py::test_value"]
    return {"task": task, "outcome": "completed", "harness_exit": 0, "resolved": resolved,
            "model_patch": "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n"
                           "@@ -1 +1 @@\n-x = 1\n+x = 2\n",
            "report": {"instance_id": task, "patch_successfully_applied": True, "resolved": resolved,
                       "resolution": "RESOLVED_FULL" if resolved else "RESOLVED_NO",
                       "report": {"FAIL_TO_PASS": {"success": f2p if resolved else [], "failure": [] if resolved else f2p},
                                  "PASS_TO_PASS": {"success": [], "failure": []},
                                  "FAIL_TO_FAIL": {"success": [], "failure": []},
                                  "PASS_TO_FAIL": {"success": [], "failure": []}}}}


@pytest.fixture
def judged_shards(make_proxy):
    """Three graded rollouts recorded through the proxy from the scripted
    model: two whose task scripts the judge's verdict, one whose does not
    (its judge answer is not JSON), and one ungraded rollout."""
    p = make_proxy()
    cases = {"j-solved": ("t1", True, True), "j-failed": ("t2", False, True), "j-garbled": ("t3", False, False)}
    for rid, (task, resolved, scripted) in cases.items():
        text = f"Fix the bug in pkg/core.py for task {task}."
        if scripted:
            text += f" [[answer: {VERDICT}]]"
        for turn in [text, "Run the tests again."]:
            r = h.post_json(p.url, f"/rollouts/{rid}/v1/chat/completions",
                            {"model": "scripted", "messages": [{"role": "user", "content": text},
                                                               {"role": "assistant", "content": "```bash\npytest -q\n```"},
                                                               {"role": "user", "content": turn}]})
            assert r.status == 200, r.body
        r = h.post_json(p.url, f"/v1/rollouts/{rid}/finish",
                        {"status": "completed", "reward": 1.0 if resolved else 0.0, "metadata": grade_meta(task, resolved)})
        assert r.status == 200, r.body
    r = h.post_json(p.url, "/rollouts/j-ungraded/v1/chat/completions",
                    {"model": "scripted", "messages": [{"role": "user", "content": "hello"}]})
    assert r.status == 200
    assert h.post_json(p.url, "/v1/rollouts/j-ungraded/finish", {"status": "success", "reward": 1.0}).status == 200
    h.wait_for_shards(p.url)
    p.terminate()
    return p.shards, cases


def judge(*args: str) -> dict:
    r = subprocess.run([h.rollcall_bin(), "judge", *args, "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def latest_finishes(shards: Path) -> dict[str, dict]:
    rows = sorted(h.read_rollouts_arrow(shards), key=lambda r: r["finished_at"])
    out = {}
    for r in rows:
        r["metadata"] = json.loads(r["metadata"]) if r["metadata"] else {}
        out[r["rollout_id"]] = r
    return out


def test_a_scripted_judge_gives_exact_rewards_with_provenance(judged_shards, upstream, tmp_path):
    import hashlib
    shards, cases = judged_shards
    rep = judge("--judge", f"{upstream}/v1", "--model", "scripted", "--shards", str(shards), "--concurrency", "2")
    assert (rep["judged"], rep["errors"], rep["ungraded"], rep["rollouts"]) == (3, 1, 1, 4), rep
    assert rep["reference_guided"] == 3  # the grades name the gold FAIL_TO_PASS tests
    assert rep["trajectories_per_s"] > 0
    j = sum(WEIGHTS[k] * SCORES[k] for k in WEIGHTS)
    now = latest_finishes(shards)
    for rid, (task, resolved, scripted) in cases.items():
        r = now[rid]
        rev = r["metadata"]["revision"]
        want_j = j if scripted else 0.0
        assert rev["j"] == pytest.approx(want_j)
        assert r["reward"] == pytest.approx((1.0 if resolved else -1.0) + 0.5 * want_j), rid
        assert (rev["number"], rev["source"], rev["rubric"]) == (1, "judge", "swe")
        assert rev["rubric_sha256"] == hashlib.sha256(SWE_RUBRIC.read_bytes()).hexdigest()
        assert rev["judge"] == f"{upstream}/v1" and rev["alpha"] == 0.5
        assert rev["base_reward"] == (1.0 if resolved else -1.0)
        assert rev["steps"] >= 1
        if scripted:
            assert rev["scores"] == SCORES and rev["error"] is None
        else:
            assert rev["scores"] is None and "unparseable answer" in rev["error"]
        assert r["metadata"]["report"] == grade_meta(task, resolved)["report"]  # the grade is kept
    assert "revision" not in now["j-ungraded"]["metadata"]
    # The exports pick the latest revision; the original is still there.
    for flag, want in [([], {rid: now[rid]["reward"] for rid in cases}),
                       (["--reward-revision", "original"], {rid: 1.0 if c[1] else 0.0 for rid, c in cases.items()})]:
        out = tmp_path / ("sft-" + (flag[-1] if flag else "latest"))
        r = subprocess.run([h.rollcall_bin(), "export", "sft", "--shards", str(shards), "--out", str(out), *flag],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        got = {s["rollout_id"]: s["reward"] for s in pq.read_table(out / "sft.parquet").to_pylist()}
        assert all(got[rid] == pytest.approx(want[rid]) for rid in cases), (flag, got)

    # A rubric of the user's own: one rubric, J is its score.
    own = tmp_path / "own.toml"
    own.write_text('name = "one"\ninstructions = "Grade it."\n[[rubrics]]\nkey = "R5"\nname = "d"\n'
                   'weight = 2.0\ndescription = "Discriminative checks."\n')
    # The scripted verdict scores R1..R7: read strictly, it does not fit a
    # rubric of R5 alone, so every answer is an error and J = 0.
    rep = judge("--judge", f"{upstream}/v1", "--shards", str(shards), "--rubric", str(own), "--alpha", "1",
                "--concurrency", "1")
    assert rep["errors"] == 3 and rep["judged"] == 3 and rep["rubric"] == str(own)
    now = latest_finishes(shards)
    assert now["j-solved"]["metadata"]["revision"]["number"] == 2
    assert now["j-solved"]["reward"] == pytest.approx(1.0)
    assert "R1, which is not a rubric" in now["j-solved"]["metadata"]["revision"]["error"]


def test_the_embedded_engine_as_judge_counts_its_unparseable_answers(judged_shards, gguf):
    shards, cases = judged_shards
    rep = judge("--judge", "embedded", "--model-file", str(gguf), "--shards", str(shards),
                "--max-tokens", "48", "--concurrency", "3")
    assert rep["judged"] == 3 and rep["ungraded"] == 1, rep
    assert rep["judge"] == f"embedded:{gguf.name}"
    # A 135M model rarely writes the strict JSON: every miss is J = 0, counted.
    now = latest_finishes(shards)
    misses = [rid for rid in cases if now[rid]["metadata"]["revision"]["error"]]
    assert rep["errors"] == len(misses)
    for rid in misses:
        base = now[rid]["metadata"]["revision"]["base_reward"]
        assert now[rid]["reward"] == base and now[rid]["metadata"]["revision"]["j"] == 0.0


# ---------------------------------------------------------------- reranking

def rerank(*args: str) -> dict:
    r = subprocess.run([h.rollcall_bin(), "rerank", *args, "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def candidates(make_proxy):
    """Three tasks' candidates, graded, each trajectory scripting the value
    the scripted value model answers for it."""
    groups = {"g1": [(False, 0.2), (True, 0.9), (False, 0.4)], "g2": [(False, 0.5), (False, 0.6)],
              "g3": [(True, 0.1), (False, 0.8)]}
    p = make_proxy()
    for g, cands in groups.items():
        for i, (resolved, value) in enumerate(cands):
            rid = f"{g}-{i}"
            r = h.post_json(p.url, f"/rollouts/{rid}/v1/chat/completions", {"model": "scripted", "messages": [
                {"role": "user", "content": f"Solve task {g}. [[answer: {value}]]"}]})
            assert r.status == 200, r.body
            meta = {**grade_meta(g, resolved), "group": g}
            assert h.post_json(p.url, f"/v1/rollouts/{rid}/finish",
                               {"status": "completed", "reward": float(resolved), "metadata": meta}).status == 200
    h.wait_for_shards(p.url)
    p.terminate()
    return p.shards


def test_rerank_prints_the_pick_beside_random_and_pass_at_k(candidates, upstream):
    rep = rerank("--shards", str(candidates), "--value-model", f"{upstream}/v1", "--model", "scripted")
    assert (rep["tasks"], rep["candidates"], rep["unscored"], rep["k_min"], rep["k_max"]) == (3, 7, 0, 2, 3), rep
    picks = {t["group"]: t["pick"] for t in rep["picks"]}
    assert picks == {"g1": "g1-1", "g2": "g2-1", "g3": "g3-1"}
    assert rep["pick_resolved_at_1"] == pytest.approx(1 / 3)
    assert rep["random_resolved_at_1"] == pytest.approx((1 / 3 + 0 + 1 / 2) / 3)
    assert rep["pass_at_k"] == pytest.approx(2 / 3)
    text = subprocess.run([h.rollcall_bin(), "rerank", "--shards", str(candidates), "--value-model",
                           f"{upstream}/v1", "--model", "scripted"], capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    for line in ["value pick", "random pick (expected)", "pass@k (oracle)"]:
        assert line in text.stdout, text.stdout


def test_rerank_by_the_embedded_models_yes_probability(candidates, gguf):
    rep = rerank("--shards", str(candidates), "--by", "yes", "--value-model", "embedded", "--model-file", str(gguf))
    assert rep["tasks"] == 3 and rep["unscored"] == 0, rep
    for t in rep["picks"]:
        assert all(0.0 <= c["score"] <= 1.0 for c in t["candidates"]), t
    assert rep["pass_at_k"] == pytest.approx(2 / 3)


# ---------------------------------------------------------------- credit assignment

def test_judge_steps_scores_the_productive_prefix_for_sft(make_proxy, upstream, tmp_path):
    """`rollcall judge --steps` on an unresolved trajectory of three calls:
    the scripted judge (its verdict scripted in the task text of the task
    file) names step 2 the first critical mistake, so the first call keeps
    weight 1 and the rest 0 in `export sft --step-scores`."""
    steps_verdict = json.dumps({"reasoning": "Deleting the file lost the way.", "values": [0.8, 0.1],
                                "first_critical_mistake": 2})
    task = {"instance_id": "t9", "repo": "acme/pkg", "base_commit": "abc", "test_patch": "",
            "problem_statement": f"Fix the bug in pkg/core.py. [[answer: {steps_verdict}]]",
            "FAIL_TO_PASS": ["tests/test_core.py::test_value"], "PASS_TO_PASS": [],
            "patch": "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    p = make_proxy()
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    history = [{"role": "user", "content": "Fix the bug in pkg/core.py. [[run: ls pkg]] [[run: rm pkg/core.py]]"}]
    for obs in ["<returncode>0</returncode>\ncore.py", "<returncode>0</returncode>", None]:
        r = h.post_json(p.url, "/rollouts/s-1/v1/chat/completions",
                        {"model": "scripted", "messages": history, "tools": tools})
        assert r.status == 200, r.body
        if obs:
            msg = r.json()["choices"][0]["message"]
            history = history + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": obs}]
    meta = {**grade_meta("t9", False), "group": "t9"}
    assert h.post_json(p.url, "/v1/rollouts/s-1/finish", {"status": "completed", "reward": 0.0, "metadata": meta}).status == 200
    for rid in ["s-ok"]:  # a resolved one is left out
        assert h.post_json(p.url, f"/rollouts/{rid}/v1/chat/completions",
                           {"model": "scripted", "messages": history[:1]}).status == 200
        assert h.post_json(p.url, f"/v1/rollouts/{rid}/finish",
                           {"status": "completed", "reward": 1.0, "metadata": grade_meta("t9", True)}).status == 200
    h.wait_for_shards(p.url)
    p.terminate()

    out = tmp_path / "steps.jsonl"
    rep = judge("--steps", "--steps-out", str(out), "--judge", f"{upstream}/v1", "--model", "scripted",
                "--shards", str(p.shards), "--tasks", str(tasks))
    assert (rep["judged"], rep["resolved_skipped"], rep["errors"], rep["step_scores"]) == (1, 1, 0, 2), rep
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [(l["sequence"], l["score"]) for l in lines] == [(0, 1.0), (1, 0.0)]
    assert all("first critical mistake the judge named" in l["rule"] for l in lines)
    assert "revision" not in latest_finishes(p.shards)["s-1"]["metadata"]  # rewards untouched

    sft = tmp_path / "sft"
    r = subprocess.run([h.rollcall_bin(), "export", "sft", "--shards", str(p.shards), "--out", str(sft),
                        "--step-scores", str(out), "--max-reward", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (sample,) = pq.read_table(sft / "sft.parquet").to_pylist()  # one segment: the history extends
    weights = [w for m, w in zip(sample["messages"], sample["loss_weights"]) if m["role"] == "assistant"]
    assert weights[:2] == [1.0, 0.0], (weights, sample["rule"])
    assert "step_scores" in sample["rule"]
