"""The trainer adapters of the job API, through the trainers' own code.

TRL's GRPOTrainer driving rollcall online (`rollcall_data.trl.Online`):
two real GRPO steps on the CPU, each step's rollouts a job of `rollcall
serve`'s job API, run by mini-swe-agent in Docker containers against the
embedded model, graded by hidden tests; after each step the weights go to
the embedded route as the next policy version.

Checked: the parameters change; the second step's calls carry the first
step's policy version; the token ids TRL trained on are the ids recorded
in the shards; the rewards TRL saw are the graded ones.

verl's agent loop (`rollcall_data.verl_agent.RollcallAgentLoop`), made by
hydra from its YAML registration as verl's AgentLoopWorker makes it: the
`rollout.n` runs of one row share one job and claim one sample each.

Runs in the trainers' venv (TRL 1.16, verl 0.9.1) with `make test`, after
dockerd, the task images, mini-swe-agent and the model are installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import rollcall_harness as h
from rollcall_data.trl import Online

ADMIN = "online-admin"
FAMILY = h.REPO_ROOT / "fixtures" / "tasks" / "inflection" / "tasks.jsonl"
# One command solves it: the 135M model, sampling at temperature 0.7 under
# a short prompt, writes it (or another command that creates the file) a
# quarter to half of the time (2/8 and 5/8 in one run), so a group's rewards
# differ. Each step has two groups of 8, four in all: the chance that none
# differs is about 1e-4.
TEST_PATCH = """diff --git a/tests/test_done.py b/tests/test_done.py
new file mode 100644
--- /dev/null
+++ b/tests/test_done.py
@@ -0,0 +1,5 @@
+import pathlib
+
+
+def test_done():
+    assert pathlib.Path("DONE.txt").exists()
"""
PROBLEM = """Create the file DONE.txt holding the word done. Run this command:

```bash
echo done > DONE.txt
```"""
TEXT_MODE = ["-c", "mini_textbased.yaml", "-c", "model.model_class=litellm_textbased",
             "-c", r"model.action_regex=\A(?:(?!```).)*```(?:mswea_bash_command|bash|sh)?[ \t]*\n(.*?)\n```",
             "-c", "agent.system_template=You are a helpful assistant that runs shell commands. "
                   "Answer with one bash command in a ```bash code block.",
             "-c", "agent.instance_template={{task}}",
             "-c", "agent.step_limit=1"]


def tasks(n: int) -> list[dict]:
    base = json.loads(FAMILY.read_text().splitlines()[0])
    if subprocess.run(["docker", "images", "-q", base["image"]], capture_output=True, text=True).stdout.strip() == "":
        pytest.fail(f"task image {base['image']} is missing: run `make task-image`")
    out = []
    for i in range(n):
        t = dict(base)
        t.update(instance_id=f"done-{i}", problem_statement=PROBLEM, test_patch=TEST_PATCH,
                 FAIL_TO_PASS=["tests/test_done.py::test_done"], PASS_TO_PASS=[], patch=None)
        out.append(t)
    return out


def serve(tmp_path: Path, gguf: Path) -> h.Proxy:
    toml = f"""
[server]
admin_keys_env = "TEST_ADMIN_KEYS"
[shards]
max_age_secs = 3600
[[routes]]
name = "smol"
kind = "embedded"
[routes.embedded]
model_file = "{gguf}"
default_max_tokens = 48
default_temperature = 0.7
kv_slots = 4
"""
    env = {"TEST_ADMIN_KEYS": ADMIN, "ROLLCALL_HARNESS_DIR": h.harness_dir()}
    return h.start_proxy(tmp_path, "unused", toml=toml, env=env)


def test_two_grpo_steps_through_the_job_api(gguf, tmp_path, monkeypatch):
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker daemon answers: run .ci/docker-up (make test does)")
    p = serve(tmp_path, gguf)
    try:
        tok, model = h.plain_model_from_gguf(gguf)
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        job = {"tasks": tasks(2), "harness": "mini-swe-agent", "model": "smol", "concurrency": 4,
               "timeout_secs": 300, "grade_timeout_secs": 300, "harness_args": TEXT_MODE}
        online = Online(p.url, job, key=ADMIN)
        monkeypatch.chdir(tmp_path)
        trainer = GRPOTrainer(
            model=model,
            processing_class=tok,
            reward_funcs=online.reward,
            train_dataset=online.prompts(),
            rollout_func=online.rollout_func,
            callbacks=[online.callback()],
            args=GRPOConfig(output_dir=str(tmp_path / "grpo"), num_generations=8, per_device_train_batch_size=16,
                            max_steps=2, learning_rate=1e-5, report_to="none", use_cpu=True, shuffle_dataset=False,
                            logging_steps=1, save_strategy="no"),
        )
        trainer.train()
        assert trainer.state.global_step == 2
        assert [s["policy_version"] for s in online.steps] == [0, 1]

        # What the shards recorded for the two jobs.
        calls = h.duck_dicts(p.shards, "SELECT rollout_id, sequence, prompt_token_ids, completion_token_ids, "
                                       "policy_version FROM t ORDER BY rollout_id, sequence")
        fins = {r["rollout_id"]: r for r in h.duck_dicts(
            p.shards, "SELECT rollout_id, reward, status, epoch_us(finished_at) AS fin_at FROM t ORDER BY fin_at",
            kind="rollouts")}
        by_rollout: dict[str, list[dict]] = {}
        for c in calls:
            by_rollout.setdefault(c["rollout_id"], []).append(c)
        varied = False
        for step in online.steps:
            rows = step["rows"]
            assert len(rows["rollout_id"]) == 16
            by_group: dict[str, set] = {}
            for rid, reward in zip(rows["rollout_id"], rows["reward"]):
                by_group.setdefault(rid.rsplit(".", 2)[0], set()).add(reward)
            assert len(by_group) == 2
            varied |= any(len(rewards) > 1 for rewards in by_group.values())
            for i, rid in enumerate(rows["rollout_id"]):
                assert rid.startswith(step["job"] + ".")
                recorded = by_rollout[rid]
                # The second step's calls ran under the weights of the first.
                assert {c["policy_version"] for c in recorded} == {step["policy_version"]}
                assert fins[rid]["status"] == "completed"
                # The rewards are the graded ones.
                assert rows["reward"][i] == fins[rid]["reward"]
                # The ids TRL trained on are the recorded ones, token for token.
                assert rows["prompt_ids"][i] == list(recorded[0]["prompt_token_ids"])
                sampled = [t for t, m in zip(rows["completion_ids"][i], rows["env_mask"][i]) if m]
                assert sampled == [t for c in recorded for t in c["completion_token_ids"]]
        assert varied, "no group had rewards that differ: GRPO had nothing to learn from"
        changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
        assert changed, "no parameter changed"
        routes = online.client.routes()
        assert routes["smol"]["policy_version"] == 2
    finally:
        p.kill()


def test_verl_agent_loops_share_one_job_and_claim_its_samples(tmp_path, upstream):
    """verl's AgentLoopWorker way: the loop instantiated by hydra from a YAML
    registration, `rollout.n` runs of one row under one uid (concurrently,
    as verl runs them); they share one job (keyed by the uid) and each gets
    its own sample as verl's `AgentLoopOutput`; verl's GRPO advantage runs
    on them keyed by the uid."""
    import asyncio

    import hydra
    import numpy as np
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils.dataset.rl_dataset import RLHFDataset

    base = json.loads(FAMILY.read_text().splitlines()[0])
    solve = dict(base)
    b64 = __import__("base64").b64encode(base["patch"].encode()).decode()
    # The scripted model runs the [[run: ...]] commands: each sample solves it.
    solve["problem_statement"] += f"\n\n[[run: echo {b64} | base64 -d | git apply]] [[run: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT]]"
    p = h.start_job_server(tmp_path, upstream, ADMIN)
    try:
        yaml = tmp_path / "agent_loops.yaml"
        job = {"tasks": [solve], "harness": "mini-swe-agent", "model": "scripted", "concurrency": 2,
               "timeout_secs": 300, "grade_timeout_secs": 300}
        OmegaConf.save(OmegaConf.create([{"name": "rollcall", "_target_": "rollcall_data.verl_agent.RollcallAgentLoop",
                                          "url": p.url, "key": ADMIN, "job": job}]), yaml)
        registered = {c.name: c for c in OmegaConf.load(yaml)}
        n = 2
        cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": n}}, "data": {}})
        import transformers

        gguf = h.model_file()
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

        def loop():
            return hydra.utils.instantiate(config=registered["rollcall"], trainer_config=DictConfigWrap(config=cfg),
                                           server_manager=None, tokenizer=tok, processor=None, hf_model_type="llama",
                                           dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                           tools=ToolListWrap([]))

        async def both():
            row = {"uid": "uid-7", "extra_info": {"instance_id": solve["instance_id"]}, "raw_prompt": []}
            return await asyncio.gather(*[loop().run({}, **row) for _ in range(n)])

        outs = asyncio.run(both())
        jobs = h.raw_request(p.url, "GET", "/v1/jobs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["jobs"]
        assert len(jobs) == 1 and jobs[0]["counts"]["done"] == n, jobs
        assert len({o.extra_fields["rollout_id"] for o in outs}) == n
        for o in outs:
            assert o.reward_score == 1.0 and o.extra_fields["uid"] == "uid-7"
            assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) and sum(o.response_mask) > 0
        # A third claim finds the group used up.
        r = h.raw_request(p.url, "POST", f"/v1/jobs/{jobs[0]['id']}/claim",
                          json.dumps({"task": solve["instance_id"]}).encode(),
                          headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status == 409 and r.json()["error"]["code"] == "all_claimed", r.body
        # verl's GRPO advantage over the outputs, grouped by uid.
        width = max(len(o.response_ids) for o in outs)
        mask = torch.zeros((n, width))
        scores = torch.zeros((n, width))
        for i, o in enumerate(outs):
            mask[i, :len(o.response_mask)] = torch.tensor(o.response_mask, dtype=torch.float32)
            scores[i, len(o.response_ids) - 1] = o.reward_score
        adv, _ = compute_grpo_outcome_advantage(scores, mask, np.array([o.extra_fields["uid"] for o in outs]))
        assert adv.shape == (n, width) and torch.isfinite(adv).all()
    finally:
        p.kill()


def test_make_learn_runs_every_phase_on_a_small_split(gguf, tmp_path):
    """`make learn`'s driver end to end on a small split: the baseline, the
    scripted teacher's rollouts through mini-swe-agent exported token-exact
    and trained with TRL's SFT, the weights hot-loaded, one GRPO step, an
    evaluation after each; the curve's figures and plot written. The rows
    SFT trained on are the teacher's recorded calls, token for token."""
    import pyarrow.parquet as pq

    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker daemon answers: run .ci/docker-up (make test does)")
    out = tmp_path / "learn"
    r = subprocess.run([sys.executable, str(h.REPO_ROOT / "harness-adapters" / "mini-swe-agent" / "learn.py"),
                        "--bin", h.rollcall_bin(), "--harness-dir", h.harness_dir(), "--model-file", str(gguf),
                        "--seed", "4242", "--out", str(out), "--train", "4", "--heldout", "2", "--sft-epochs", "1",
                        "--grpo-steps", "1", "--grpo-tasks", "1", "--group", "2"],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    curve = json.loads((out / "curve.json").read_text())
    assert curve["seed"] == 4242
    assert [(p["phase"], p["policy_version"], p["tasks"]) for p in curve["curve"]] == [
        ("baseline", 0, 2), ("after SFT", 1, 2), ("GRPO step 1", 2, 2)]
    assert (out / "learn-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out resolved@1" in r.stdout and "distillation:" in r.stdout

    # The teacher solved every training task; SFT trained on its calls' ids.
    sft = pq.read_table(out / "sft" / "sft_tokens.parquet").to_pylist()
    assert len(sft) == 4 and all(s["reward"] == 1.0 for s in sft)
    calls = {c["rollout_id"]: c for c in h.duck_dicts(
        out / "shards", "SELECT rollout_id, route, prompt_token_ids, completion_token_ids FROM t WHERE route = 'teacher'")}
    assert len(calls) == 4
    for s in sft:
        c = calls[s["rollout_id"]]
        assert s["input_ids"] == list(c["prompt_token_ids"]) + list(c["completion_token_ids"])
        assert s["assistant_masks"] == [0] * len(c["prompt_token_ids"]) + [1] * len(c["completion_token_ids"])
    # Each held-out evaluation ran under its phase's weights.
    versions = h.duck_dicts(out / "shards", "SELECT DISTINCT policy_version FROM t WHERE route = 'smol' "
                                            "AND rollout_id LIKE '%heldout%' ORDER BY 1")
    assert [v["policy_version"] for v in versions] == [0, 1, 2]
