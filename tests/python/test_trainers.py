"""The exports loaded by the trainers' own code, with nothing of ours in
between but `rollcall_data` (python/, shipped with rollcall):

- TRL 1.16.0: `SFTTrainer` runs 2 steps on the token-exact SFT export, with
  the loss on sampled tokens only (the trained-token count equals the
  export's mask sum), and `GRPOTrainer` replays the RL groups through a
  `rollout_func`;
- verl 0.9.1 (`pip install verl --no-deps` plus what its data classes
  import): every RL row becomes an `AgentLoopOutput` with its logprobs and
  reward intact, `MultiTurnSFTDataset` loads the SFT export, and
  `compute_grpo_outcome_advantage` runs on the padded batch;
- slime (not on PyPI): its `Sample` fields and status values as of commit
  624b824a898ab0ec1fcb4d373004c7f3852bf515 (written down in
  docs/datasets.md), and the `torch.save({"samples": ...})` replay file.

The calls are real: the embedded model (SmolLM2-135M-Instruct GGUF) answers
through the proxy with token ids and logprobs recorded, and transformers
loads the same GGUF file as the model the trainers train. Each loading
snippet is taken from docs/datasets.md and executed as written."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest

import rollcall_harness as h

# Required, never skipped (make test installs them: requirements-trainers.txt).
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
import verl  # noqa: E402
import rollcall_data  # noqa: E402

DOCS = h.REPO_ROOT / "docs" / "datasets.md"

TOML = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "smol"
kind = "embedded"
[routes.embedded]
model_file = "{model}"
default_max_tokens = 16
default_temperature = 0.0
"""

# slime's Sample (slime/utils/types.py at 624b824a898ab0ec1fcb4d373004c7f3852bf515):
SLIME_SAMPLE_FIELDS = {
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs",
    "response", "response_length", "label", "reward", "loss_mask", "weight_versions",
    "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata",
    "generate_function_path", "custom_rm_path", "train_metadata", "session_id",
    "non_generation_time", "spec_info", "prefix_cache_info",
}
SLIME_STATUS = {"pending", "completed", "truncated", "aborted", "failed"}

# group -> rollouts with their rewards; "g3" has one rollout (incomplete for
# --group-size 2), "open" never finishes (no reward).
ROLLOUTS = {"g1": [("r1", 1.0), ("r2", 0.0)], "g2": [("r3", 0.5), ("r4", 1.0)], "g3": [("r5", 1.0)]}
QUESTIONS = ["What is the capital of France?", "Name a primary color."]


def doc_snippet(name: str) -> str:
    """The ```python block after `<!-- test: NAME -->` in docs/datasets.md."""
    m = re.search(rf"<!-- test: {re.escape(name)} -->\s*```python\n(.*?)```", DOCS.read_text(), re.S)
    assert m, f"docs/datasets.md has no snippet marked <!-- test: {name} -->"
    return m.group(1)


def run_snippet(name: str, **env) -> dict:
    scope = dict(env)
    exec(compile(doc_snippet(name), f"docs/datasets.md:{name}", "exec"), scope)
    return scope


def cli(*args: str) -> str:
    p = subprocess.run([h.rollcall_bin(), *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"rollcall {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def hf(gguf):
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return tok, model


@pytest.fixture(scope="module")
def shards(gguf, tmp_path_factory) -> Path:
    """Two-turn conversations with the embedded model, token ids captured."""
    d = tmp_path_factory.mktemp("trainers")
    p = h.start_proxy(d, "unused", toml=TOML.format(model=gguf))
    try:
        runs = [(g, rid, reward) for g, rs in ROLLOUTS.items() for rid, reward in rs] + [(None, "open", None)]
        for i, (group, rid, reward) in enumerate(runs):
            c = openai.OpenAI(base_url=f"{p.url}/rollouts/{rid}/v1", api_key="k", timeout=300)
            msgs = [{"role": "user", "content": QUESTIONS[i % 2]}]
            for follow_up in ["Say it again, shorter.", None]:
                a = c.chat.completions.create(model="smol", messages=msgs).choices[0].message
                msgs.append({"role": "assistant", "content": a.content})
                if follow_up:
                    msgs.append({"role": "user", "content": follow_up})
            if group:
                r = h.post_json(p.url, f"/v1/rollouts/{rid}/finish",
                                {"status": "success" if reward else "failure", "reward": reward,
                                 "metadata": {"group": group}})
                assert r.status == 200, r.body
        h.wait_for_shards(p.url)
    finally:
        p.kill()
    return p.shards


def export_rl(shards: Path, out: Path, trainer: str, *extra: str) -> dict:
    cli("export", "rl", "--shards", str(shards), "--out", str(out), "--trainer", trainer, *extra)
    return json.loads((out / "rl_report.json").read_text())


def test_trl_sft_trains_on_sampled_tokens_only(shards, hf, tmp_path, monkeypatch):
    tok, model = hf
    out = tmp_path / "sft"
    cli("export", "sft", "--shards", str(shards), "--out", str(out))
    rows = pq.read_table(out / "sft_tokens.parquet").to_pylist()
    assert len(rows) == 6, [r["sample_id"] for r in rows]
    # The ids are the served ones: the last call's prompt + completion.
    calls = h.rows_by_rollout(h.read_calls_arrow(shards))
    last = calls["r1"][-1]
    r1 = next(r for r in rows if r["rollout_id"] == "r1")
    assert r1["input_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    monkeypatch.chdir(tmp_path)
    scope = run_snippet("trl-sft", OUT=str(out), model=model, tokenizer=tok)
    trainer = scope["trainer"]
    counted = []
    collate = trainer.data_collator

    def counting(examples):
        b = collate(examples)
        counted.append(int((b["labels"] != -100).sum()))
        return b

    trainer.data_collator = counting
    trainer.train()
    assert trainer.state.global_step == 2
    # Every step saw the whole (small) dataset: what was trained per epoch is the mask sum.
    mask_sum = sum(sum(r["assistant_masks"]) for r in rows)
    per_step = len(rows) if len(rows) <= trainer.args.per_device_train_batch_size else None
    assert per_step, "the test expects one batch per step"
    assert counted == [mask_sum, mask_sum], (counted, mask_sum)


def test_trl_grpo_replays_the_rl_groups(shards, hf, tmp_path, monkeypatch):
    tok, model = hf
    out = tmp_path / "rl-trl"
    rep = export_rl(shards, out, "trl", "--group-size", "2")
    assert rep["incomplete_groups"] == 1 and rep["missing_reward"] >= 1, rep
    rows = pq.read_table(out / "rl.parquet").to_pylist()
    assert [r["group"] for r in rows] == ["g1", "g1", "g2", "g2"]
    for r in rows:
        assert len(r["completion_ids"]) == len(r["env_mask"]) == len(r["logprobs"])
    monkeypatch.chdir(tmp_path)
    scope = run_snippet("trl-grpo", OUT=str(out), model=model, tokenizer=tok)
    trainer = scope["trainer"]
    trainer.train()
    assert trainer.state.global_step == 1
    logged = {k for e in trainer.state.log_history for k in e}
    assert "reward" in logged, logged


def test_verl_agent_loop_outputs_keep_logprobs_and_rewards(shards, tmp_path):
    out = tmp_path / "rl-verl"
    export_rl(shards, out, "verl")
    rows = pq.read_table(out / "rl.parquet").to_pylist()
    scope = run_snippet("verl-rl", OUT=str(out))
    outputs = scope["outputs"]
    assert len(outputs) == len(rows) == 5  # "open" has no reward: dropped
    for o, r in zip(outputs, rows):
        assert o.response_logprobs == pytest.approx(r["response_logprobs"])
        assert o.reward_score == r["reward_score"] and o.reward_score is not None
        assert o.prompt_ids == r["prompt_ids"] and o.response_mask == r["response_mask"]
        assert o.extra_fields["uid"] == r["extra_fields"]["uid"]
        assert o.num_turns == 4
        assert sum(o.response_mask) < len(o.response_ids)  # an observation between the two answers
        # Nothing the row carries is outside the model: pydantic would drop it silently.
        assert set(r) <= set(type(o).model_fields)


def test_verl_grpo_advantage_runs_on_the_batch(shards, tmp_path):
    out = tmp_path / "rl-verl"
    export_rl(shards, out, "verl", "--group-size", "2")
    scope = run_snippet("verl-batch", OUT=str(out))
    adv = scope["advantages"]
    data = scope["data"]
    uid = list(data.non_tensor_batch["uid"])
    assert uid == ["g1", "g1", "g2", "g2"]
    mask = data.batch["response_mask"].bool()
    # GRPO: within a group, rewards (1, 0) normalize to +/- the same value on every sampled token.
    a0, a1 = adv[0][mask[0]], adv[1][mask[1]]
    assert torch.allclose(a0, a0[0].expand_as(a0)) and float(a0[0]) > 0 > float(a1[0])
    assert float(a0[0]) == pytest.approx(-float(a1[0]), rel=1e-4)
    assert float(adv[0][~mask[0]].abs().sum()) == 0.0


def test_verl_multiturn_sft_dataset_loads_the_sft_export(shards, hf, tmp_path):
    tok, _ = hf
    out = tmp_path / "sft-verl"
    cli("export", "sft", "--shards", str(shards), "--out", str(out), "--trainer", "verl")
    scope = run_snippet("verl-sft", OUT=str(out), tokenizer=tok)
    ds = scope["dataset"]
    assert len(ds) == 6
    item = ds[0]
    assert int(item["loss_mask"].sum()) > 0


def test_slime_samples_and_replay_file(shards, tmp_path, monkeypatch):
    out = tmp_path / "rl-slime"
    rep = export_rl(shards, out, "slime", "--group-size", "2")
    rows = pq.read_table(out / "rl.parquet").to_pylist()
    assert len(rows) == 4 and rep["samples"] == 4
    for i, r in enumerate(rows):
        assert set(r) <= SLIME_SAMPLE_FIELDS, set(r) - SLIME_SAMPLE_FIELDS
        assert r["status"] in SLIME_STATUS and r["status"] == "completed"
        assert isinstance(r["rollout_id"], int) and isinstance(r["reward"], float)
        assert r["index"] == i and r["response_length"] == len(r["loss_mask"]) == len(r["rollout_log_probs"])
        assert r["metadata"]["rollout_id"] in {"r1", "r2", "r3", "r4"}
    assert [r["group_index"] for r in rows] == [0, 0, 1, 1]
    assert len({r["rollout_id"] for r in rows}) == 4
    monkeypatch.chdir(tmp_path)
    run_snippet("slime", OUT=str(out))
    blob = torch.load(tmp_path / "rollout_data" / "0.pt", weights_only=False)
    assert blob["rollout_id"] == 0 and blob["samples"] == rows
