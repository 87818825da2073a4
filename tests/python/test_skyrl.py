"""SkyRL's trainer taking its rollouts from rollcall's job API
(`rollcall_data.skyrl.RollcallGenerator`), through SkyRL's own code (skyrl
0.3.0 from PyPI, never re-implemented here): its `PromptDataset` and
dataloader make the batch from a dataset file, `prepare_generator_input` the
`GeneratorInput`, and a real `RayPPOTrainer` (built on the CPU, without
models or inference engines) runs what a training step runs before the
models' passes: `generate` (the generator, then `validate_generator_output`),
`postprocess_generator_output`, `convert_to_training_input` and
`compute_advantages_and_returns`.

Two batches, each one job of a `rollcall serve` in front of the scripted
model (Chat Completions only, behind a `vllm` route: token ids captured), in
Docker containers with the shipped task family:

- mini-swe-agent on three tasks, two samples each (one task solved, one
  not, one whose command the OOM killer ends: an infrastructure error):
  one segment per rollout, so one row per prompt (SkyRL's plain layout);
- Codex with auto-compaction at a low token limit, on one task that only
  its sample 0 solves: a long command output makes it summarize and
  restart its context mid-rollout, so each rollout has two segments:
  step-wise rows (`is_last_step`, `trajectory_ids`), and step-wise GRPO
  advantages that differ.

Runs in `.venv-skyrl` (Python 3.12) with `make test`, after dockerd, the
task images, the harnesses and the model (its tokenizer) are installed.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.dataset import PromptDataset
from skyrl.train.generators.base import GeneratorInterface
from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.trainer_utils import validate_generator_output
from skyrl.utils.tok import get_tokenizer

import rollcall_harness as h
from rollcall_data.skyrl import RollcallGenerator
from test_batch import SUBMIT, apply_b64, family, leftovers, scripted  # noqa: F401

ADMIN = "skyrl-admin"
# Codex summarizes its context once its token count passes this: the
# scripted model's usage is about 3,850 tokens at the first call and at most
# about 4,560 after the summary, while the long output (cut to ~10 kB by
# Codex) takes the count well past it.
COMPACT = ["-c", "model_auto_compact_token_limit=5500"]
# Long the first time only: after the summary the scripted model starts its
# commands again (it counts the tool results it sees), and the second run
# must not overflow the context again.
LONG_ONCE = "test -e /tmp/long.once && echo again || { touch /tmp/long.once; seq 1 6000; }"


def in_sample_0(cmd: str) -> str:
    """`cmd` run by sample 0 only: the harness's command line in the
    container holds its rollout id (`JOB.TASK.sK.aJ`, in its base URL), so
    the scripted model solves the task in one sample of the group and not
    in the other, and GRPO has rewards that differ."""
    return f"if grep -qa '[.]s0[.]a[0-9]' /proc/[0-9]*/cmdline 2>/dev/null; then {cmd}; else echo not this sample; fi"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`rollcall serve` with the job API, in front of a scripted model that
    serves Chat Completions only (Codex's Responses calls are translated,
    so their token ids are captured too)."""
    tmp = tmp_path_factory.mktemp("skyrl")
    up = h.start_upstream(tmp / "upstream", apis="chat")
    p = h.start_job_server(tmp, up.url, ADMIN, "[shards]\nmax_age_secs = 3600")
    try:
        yield p
    finally:
        p.kill()
        up.kill()


@pytest.fixture(scope="module")
def tokenizer(gguf):
    # SkyRL's own loader (it sets the pad token to EOS where the model has none).
    return get_tokenizer(str(gguf.parent), gguf_file=gguf.name)


def trainer_for(generator, tasks: list[dict], tokenizer, tmp: Path, n: int, step_wise: bool) -> RayPPOTrainer:
    """SkyRL's trainer over a dataset of `tasks` (a row per task: its id as
    the prompt and in `instance_id`), `n` samples per prompt, all tasks in
    one batch."""
    rows = [{"prompt": [{"role": "user", "content": t["instance_id"]}], "instance_id": t["instance_id"]}
            for t in tasks]
    path = tmp / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = PromptDataset(str(path), tokenizer, max_prompt_length=512, num_workers=1)
    cfg = SkyRLTrainConfig()
    cfg.trainer.train_batch_size = cfg.trainer.policy_mini_batch_size = len(tasks)
    cfg.generator.n_samples_per_prompt = n
    cfg.generator.step_wise_trajectories = step_wise
    cfg.data.dataloader.num_workers = 0
    cfg.generator.inference_engine.enable_ray_prometheus_stats = False  # no Ray cluster to scrape
    return RayPPOTrainer(cfg, tracker=None, tokenizer=tokenizer, train_dataset=dataset,
                         inference_engine_client=None, generator=generator)


def step(trainer: RayPPOTrainer):
    """One batch of SkyRL's training loop, up to the models' passes (the
    order of `RayPPOTrainer.train`). Returns the generator's output as it
    came (validated by SkyRL inside `trainer.generate`), the batch's input
    and the training batch with advantages."""
    cfg = trainer.cfg
    batch = next(iter(trainer.train_dataloader))
    generator_input, uids = prepare_generator_input(
        batch, cfg.generator.n_samples_per_prompt,
        get_sampling_params_for_backend(cfg.generator.inference_engine.backend, cfg.generator.sampling_params),
        cfg.environment.env_class, "train", 1)
    out = asyncio.run(trainer.generate(generator_input))
    raw = copy.deepcopy(out)
    if cfg.generator.step_wise_trajectories:
        uids = [t.instance_id for t in out["trajectory_ids"]]
    out, uids = trainer.postprocess_generator_output(out, uids)
    # The policy workers' data-parallel size: one worker here, no GPU.
    trainer.dispatch = SimpleNamespace(get_lcm_dp_size=lambda: 1)
    data = trainer.convert_to_training_input(out, uids)
    data["values"] = None  # what the forward passes leave without a critic
    data = trainer.compute_advantages_and_returns(data)
    return raw, generator_input, data


def check_token_exact(p: h.Proxy, generator: RollcallGenerator, out: dict, skip: list[int] = ()) -> None:
    """Every row is its rollout's recorded tokens: a segment starts from a
    recorded prompt, and the sampled tokens of a rollout's rows, in order,
    are its calls' completions."""
    rows = h.duck_dicts(p.shards, "SELECT rollout_id, sequence, prompt_token_ids, completion_token_ids "
                                  "FROM t ORDER BY rollout_id, sequence")
    calls: dict[str, list[dict]] = {}
    for r in rows:
        calls.setdefault(r["rollout_id"], []).append(r)
    rids = generator.jobs[-1]["rollout_ids"]
    sampled: dict[str, list[int]] = {}
    for i, rid in enumerate(rids):
        if i in skip:
            continue
        assert out["prompt_token_ids"][i] in [list(c["prompt_token_ids"]) for c in calls[rid]]
        sampled.setdefault(rid, []).extend(t for t, m in zip(out["response_ids"][i], out["loss_masks"][i]) if m)
    for rid, got in sampled.items():
        assert got == [t for c in calls[rid] for t in c["completion_token_ids"]], rid


def test_mini_swe_agent_rollouts_are_skyrl_rows(family, served, tokenizer, tmp_path):
    """Three tasks, two samples each: one solved, one not, and one whose
    command the OOM killer ends (an infrastructure error: no tokens to
    train on, no reward)."""
    solved, unsolved, hog = family[0], family[1], family[3]
    tasks = [scripted(solved, [apply_b64(solved["patch"]), SUBMIT]), scripted(unsolved, [SUBMIT]),
             scripted(hog, ["python3 -c 'x = bytearray(512 << 20)'", SUBMIT])]
    generator = RollcallGenerator(served.url, {"tasks": tasks, "harness": "mini-swe-agent", "model": "scripted",
                                               "concurrency": 6, "retries": 0, "limits": {"memory_mib": 128},
                                               "timeout_secs": 300, "grade_timeout_secs": 300},
                                  key=ADMIN)
    assert isinstance(generator, GeneratorInterface)
    trainer = trainer_for(generator, tasks, tokenizer, tmp_path, n=2, step_wise=False)
    out, generator_input, data = step(trainer)

    # One job, one row per prompt, in the batch's order, with the graded rewards.
    (job,) = generator.jobs
    status = generator.client.status(job["job"])
    assert status["state"] == "done" and status["counts"]["done"] == 6, status
    tasks_in = [e["instance_id"] for e in generator_input["env_extras"]]
    assert len(out["response_ids"]) == len(tasks_in) == 6
    assert [rid.split(".")[1] for rid in job["rollout_ids"]] == tasks_in
    assert len(set(job["rollout_ids"])) == 6
    want = {solved["instance_id"]: (1.0, "stop"), unsolved["instance_id"]: (0.0, "stop"),
            hog["instance_id"]: (0.0, "infra_error")}
    assert list(zip(out["rewards"], out["stop_reasons"])) == [want[t] for t in tasks_in]
    assert out["is_last_step"] == [True] * 6
    assert out["trajectory_ids"] == generator_input["trajectory_ids"]
    assert all(len(lp) == len(r) for lp, r in zip(out["rollout_logprobs"], out["response_ids"]))
    assert trainer.all_metrics["rollcall/infra_errors"] == 2
    # An infrastructure error is one masked token: nothing to learn from.
    failed = [i for i, t in enumerate(tasks_in) if t == hog["instance_id"]]
    for i in failed:
        assert (out["prompt_token_ids"][i], out["response_ids"][i], out["loss_masks"][i]) == ([0], [0], [0])
    check_token_exact(served, generator, out, skip=failed)
    # SkyRL's validation takes the rows either way: plain and step-wise.
    validate_generator_output(6, out, step_wise=False)
    validate_generator_output(6, out, step_wise=True)

    # SkyRL's training batch: left-padded sequences ending with each
    # response, the reward on each response's last token, and GRPO's
    # advantages (zero: each group's two samples got the same reward).
    seqs, mask = data["sequences"], data["attention_mask"]
    assert seqs.shape[0] == 6 and data["loss_mask"].shape == data["response_mask"].shape
    for i in range(6):
        real = seqs[i][mask[i].bool()].tolist()
        assert real == out["prompt_token_ids"][i] + out["response_ids"][i]
        assert data["loss_mask"][i].sum().item() == sum(out["loss_masks"][i])
        assert data["rewards"][i, -1].item() == out["rewards"][i]
    assert torch.isfinite(data["advantages"]).all() and (data["advantages"] == 0).all()
    assert leftovers(job["job"]) == []


def test_codex_compaction_gives_step_wise_rows(family, served, tokenizer, tmp_path):
    t = family[2]
    task = scripted(t, [LONG_ONCE, in_sample_0(apply_b64(t["patch"]))])
    generator = RollcallGenerator(served.url, {"tasks": [task], "harness": "codex", "model": "scripted",
                                               "harness_args": COMPACT, "concurrency": 2,
                                               "timeout_secs": 300, "grade_timeout_secs": 300}, key=ADMIN)
    trainer = trainer_for(generator, [task], tokenizer, tmp_path, n=2, step_wise=True)
    out, generator_input, data = step(trainer)

    # Each rollout summarized its context once: two segments, two rows,
    # contiguous, the last marked; both carry the rollout's reward (1 for
    # sample 0, which solved the task, 0 for sample 1).
    (job,) = generator.jobs
    rids = job["rollout_ids"]
    assert len(rids) == 4 and rids[0] == rids[1] != rids[2] == rids[3], rids
    assert out["is_last_step"] == [False, True, False, True]
    tids = generator_input["trajectory_ids"]
    assert out["trajectory_ids"] == [tids[0], tids[0], tids[1], tids[1]]
    assert out["rewards"] == [1.0 if ".s0." in rid else 0.0 for rid in rids] and sorted(out["rewards"]) == [0, 0, 1, 1]
    assert out["stop_reasons"] == ["stop"] * 4
    assert trainer.all_metrics["rollcall/rows"] == 4
    # SkyRL's reward metrics count each trajectory once (its last step).
    assert trainer.all_metrics["reward/avg_raw_reward"] == 0.5
    # The second segment starts from the summary, not from the first one's end.
    first, second = out["prompt_token_ids"][0], out["prompt_token_ids"][1]
    assert second[:len(first) + len(out["response_ids"][0])] != first + out["response_ids"][0]
    check_token_exact(served, generator, out)
    # SkyRL's step-wise validation takes them; its plain layout cannot
    # (more rows than prompts): such a job needs step_wise_trajectories.
    validate_generator_output(2, out, step_wise=True)
    with pytest.raises(AssertionError, match="Mismatch between prompts"):
        validate_generator_output(2, out, step_wise=False)

    # Step-wise GRPO: each trajectory's advantage (from its last step) on
    # every token of all its steps; positive where it solved the task.
    assert data["sequences"].shape[0] == 4 and data.metadata["is_last_step"] == out["is_last_step"]
    adv, resp = data["advantages"], data["response_mask"].bool()
    assert torch.isfinite(adv).all() and adv.shape == resp.shape
    per_row = []
    for i in range(4):
        values = adv[i][resp[i]].unique()
        assert len(values) == 1, values
        per_row.append(values.item())
    assert per_row[0] == per_row[1] and per_row[2] == per_row[3] and per_row[0] == -per_row[2] != 0
    assert all((a > 0) == (r == 1.0) for a, r in zip(per_row, out["rewards"]))
    assert leftovers(job["job"]) == []
