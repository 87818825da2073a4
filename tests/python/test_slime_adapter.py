"""slime's rollout side taking its rollouts from rollcall's job API
(`rollcall_data.slime.generate_rollout` as `--rollout-function-path`,
`rollcall_data.slime.reward_post_process` as
`--custom-reward-post-process-path`), through slime's own code at commit
624b824a898ab0ec1fcb4d373004c7f3852bf515 (never re-implemented here):

- the arguments: slime's parser (`get_slime_extra_args_provider`,
  `_pre_parse_mode`) and `slime_validate_args`, which loads the rollcall URL
  and job template from `--custom-config-path`'s YAML;
- the rollout: `create_rollout_manager` makes slime's `RolloutManager` Ray
  actor (local Ray, `--debug-train-only` so that it starts no SGLang
  servers: rollcall serves the model) with its data source
  (`RolloutDataSourceWithBuffer` over a prompt JSONL file) and
  `RolloutManager.generate` runs what a training step runs before the
  models' passes: `call_rollout_fn`, `validate_rollout_id_annotated`,
  `save_debug_rollout_data`, `log_rollout_data`,
  `_convert_samples_to_train_data` (with the reward post-process) and
  `_split_train_data_by_dp` (`build_dp_schedule`, `tensorize_...`): the
  per-rank `rollout_data` the train actors get;
- the eval path (`call_rollout_fn(..., evaluation=True)`,
  `log_eval_rollout_data`), and slime's plugin contract tests
  (`tests/plugin_contracts`) on the reward post-process and the rollout
  function's signature.

Two rollout steps, each one job of a `rollcall serve` in front of the
scripted model (behind a `vllm` route: token ids captured), in Docker
containers with the shipped task family:

- mini-swe-agent on two tasks, two samples each, one of them solving its
  task: one segment per rollout, slime's plain layout, rewards normalized
  as slime's default does;
- Codex with auto-compaction at a low token limit: each rollout summarizes
  its context once, so it fans out into two segments sharing its
  `rollout_id`; the post-process normalizes over rollouts, not segments.

slime is not on PyPI: `make test-slime` fetches it at the pinned commit
and runs this file with `SLIME_SRC` set; without it the tests fail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rollcall_harness as h
from test_batch import SUBMIT, apply_b64, family, leftovers, scripted  # noqa: F401

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
ADMIN = "slime-admin"
# Codex summarizes its context once its token count passes this (as in
# test_skyrl.py): the long output of the first command takes it past, and
# the second run of the command prints little.
COMPACT = ["-c", "model_auto_compact_token_limit=5500"]
LONG_ONCE = "test -e /tmp/long.once && echo again || { touch /tmp/long.once; seq 1 6000; }"
# mini-swe-agent runs on the host and its commands in the container with
# `docker exec`: forwarding the rollout id lets a command tell the samples
# of a group apart.
FORWARD_ROLLOUT_ID = ["-c", 'environment.forward_env=["ROLLCALL_ROLLOUT_ID"]']
PARALLEL = {"dp_size": 1, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}


def in_sample_0_mini(cmd: str) -> str:
    """`cmd` run by sample 0 of a group only (mini-swe-agent, its rollout id forwarded)."""
    return f'case "$ROLLCALL_ROLLOUT_ID" in *.s0.a*) {cmd};; *) echo not this sample;; esac'


def in_sample_0_inside(cmd: str) -> str:
    """`cmd` run by sample 0 only, for a harness inside the container: its
    command line holds its rollout id (in its base URL)."""
    return f"if grep -qa '[.]s0[.]a[0-9]' /proc/[0-9]*/cmdline 2>/dev/null; then {cmd}; else echo not this sample; fi"


@pytest.fixture(scope="module")
def slime_src() -> str:
    """slime's checkout at the pinned commit (`SLIME_SRC`), on sys.path."""
    src = os.environ.get("SLIME_SRC")
    if not src:
        pytest.fail("SLIME_SRC is not set: slime is not on PyPI; run `make test-slime`, which fetches it "
                    f"at {SLIME_COMMIT} and runs this file")
    if not (Path(src) / "slime" / "ray" / "rollout.py").exists():
        pytest.fail(f"SLIME_SRC={src} is not a slime checkout: run `make test-slime`")
    if (Path(src) / ".git").exists():
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert head == SLIME_COMMIT, f"SLIME_SRC is at {head}, not {SLIME_COMMIT}: run `make test-slime`"
    for p in (src, str(h.REPO_ROOT / "python")):
        if p not in sys.path:
            sys.path.insert(0, p)
    return src


@pytest.fixture(scope="module")
def ray_cluster(slime_src, tmp_path_factory):
    """A local Ray for slime's actors. Its workers (the RolloutManager,
    which imports the adapter and calls rollcall) inherit this environment:
    slime and the adapter on PYTHONPATH, the admin key."""
    import ray

    env = {"PYTHONPATH": os.pathsep.join([slime_src, str(h.REPO_ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
           "ROLLCALL_ADMIN_KEY": ADMIN, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`rollcall serve` with the job API, in front of a scripted model that
    serves Chat Completions only (Codex's Responses calls are translated,
    so their token ids are captured too)."""
    tmp = tmp_path_factory.mktemp("slime")
    up = h.start_upstream(tmp / "upstream", apis="chat")
    p = h.start_job_server(tmp, up.url, ADMIN, "[shards]\nmax_age_secs = 3600")
    try:
        yield p
    finally:
        p.kill()
        up.kill()


@pytest.fixture(scope="module")
def tokenizer_dir(slime_src, tmp_path_factory) -> Path:
    """A tokenizer for slime's data source to load (`--hf-checkpoint`): it
    only reads the prompt file here, the token ids come from rollcall."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tokenizer")
    t = Tokenizer(models.WordLevel({"[UNK]": 0, "[EOS]": 1}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(d)
    return d


def slime_args(tmp: Path, url: str, job: dict, tasks: list[dict], tokenizer: Path, n: int, monkeypatch,
               *extra: str):
    """slime's args as `train.py` parses them (slime's own arguments; the
    Megatron ones are not needed before the models' passes), for the
    adapter on `tasks`, `n` samples per prompt, all tasks in one step."""
    from slime.utils.arguments import _pre_parse_mode, get_slime_extra_args_provider, slime_validate_args

    tasks_file = tmp / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t["instance_id"], "label": t["instance_id"],
                                           "metadata": {"instance_id": t["instance_id"]}}) + "\n" for t in tasks))
    custom = tmp / "rollcall.yaml"
    custom.write_text(yaml.safe_dump({"rollcall_url": url, "rollcall_job": dict(job, tasks=str(tasks_file))}))
    argv = [
        "--rollout-function-path", "rollcall_data.slime.generate_rollout",
        "--custom-reward-post-process-path", "rollcall_data.slime.reward_post_process",
        "--custom-config-path", str(custom),
        "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata",
        "--hf-checkpoint", str(tokenizer),
        "--rollout-batch-size", str(len(tasks)), "--n-samples-per-prompt", str(n),
        "--global-batch-size", str(len(tasks) * n), "--num-rollout", "1",
        "--advantage-estimator", "grpo", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "65536",
        "--save-debug-rollout-data", str(tmp / "rollout_data" / "{rollout_id}.pt"),
        "--debug-train-only",  # no SGLang servers: rollcall serves the model
        *extra,
    ]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    parser = get_slime_extra_args_provider()(argparse.ArgumentParser(allow_abbrev=False))
    pre = _pre_parse_mode()
    args, unknown = parser.parse_known_args(argv)
    assert unknown == ["--debug-train-only"], unknown  # parsed by _pre_parse_mode
    for k, v in vars(pre).items():
        setattr(args, k, v)
    slime_validate_args(args)
    assert args.rollcall_url == url and args.rollcall_job["harness"] == job["harness"]
    return args


def rollout_step(ray, args, rollout_id: int = 0):
    """What slime's train.py does for one rollout step up to the train
    actors: the RolloutManager actor (slime's `create_rollout_manager`),
    `generate`, and the rank's `rollout_data` out of the object store. Also
    the Samples as slime saved them (`--save-debug-rollout-data`), read back
    with slime's own loader."""
    from slime.observability.rollout_data_utils import load_debug_rollout_data
    from slime.ray.placement_group import create_rollout_manager

    manager, _ = create_rollout_manager(args, None)
    try:
        ray.get(manager.set_train_parallel_config.remote(PARALLEL))
        (box,) = ray.get(manager.generate.remote(rollout_id))
        data = ray.get(box.inner)
    finally:
        ray.kill(manager)
    samples = load_debug_rollout_data(args.save_debug_rollout_data, rollout_id=rollout_id)
    return samples, data


def slime_default_rewards(args, samples):
    """slime's own reward post-process (`RolloutManager._post_process_rewards`
    without a custom one), called on the RolloutManager class outside Ray."""
    from slime.ray.rollout import RolloutManager

    cls = RolloutManager.__ray_metadata__.modified_class
    manager = cls.__new__(cls)
    manager.args = args
    manager.custom_reward_post_process_func = None
    return cls._post_process_rewards(manager, samples)


def recorded(p: h.Proxy) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    calls = h.rows_by_rollout(h.duck_dicts(p.shards, "SELECT rollout_id, sequence, prompt_token_ids, "
                                                     "completion_token_ids FROM t"))
    fins = {r["rollout_id"]: r for r in h.duck_dicts(p.shards, "SELECT rollout_id, reward, status FROM t",
                                                     kind="rollouts")}
    return calls, fins


def check_token_exact(p: h.Proxy, samples) -> None:
    """Each Sample is a segment of its rollout's recorded calls: its prompt
    part is a recorded prompt, and the sampled tokens of a rollout's
    Samples, in order, are its calls' completions; the reward is the graded
    one."""
    calls, fins = recorded(p)
    sampled: dict[str, list[int]] = {}
    for s in samples:
        rid = s.metadata["rollcall"]["rollout_id"]
        prompt = s.tokens[:len(s.tokens) - s.response_length]
        response = s.tokens[len(s.tokens) - s.response_length:]
        assert prompt in [list(c["prompt_token_ids"]) for c in calls[rid]]
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 0
        sampled.setdefault(rid, []).extend(t for t, m in zip(response, s.loss_mask) if m)
        assert s.reward == fins[rid]["reward"] and fins[rid]["status"] == "completed"
    for rid, got in sampled.items():
        assert got == [t for c in calls[rid] for t in c["completion_token_ids"]], rid


def jobs_of(p: h.Proxy) -> list[dict]:
    return h.raw_request(p.url, "GET", "/v1/jobs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["jobs"]


def test_mini_swe_agent_rollouts_through_slimes_rollout_manager(family, served, ray_cluster, tokenizer_dir,
                                                                 tmp_path, monkeypatch):
    from slime.observability.rollout_metrics import log_eval_rollout_data
    from slime.rollout.base_types import RolloutFnEvalOutput, call_rollout_fn
    from slime.utils.misc import load_function
    from slime.utils.types import Sample

    solved, unsolved = family[0], family[1]
    tasks = [scripted(solved, [in_sample_0_mini(apply_b64(solved["patch"])), SUBMIT]), scripted(unsolved, [SUBMIT])]
    job = {"harness": "mini-swe-agent", "model": "scripted", "concurrency": 4, "timeout_secs": 300,
           "grade_timeout_secs": 300, "harness_args": FORWARD_ROLLOUT_ID}
    args = slime_args(tmp_path, served.url, job, tasks, tokenizer_dir, 2, monkeypatch)
    before = {j["id"] for j in jobs_of(served)}
    samples, data = rollout_step(ray_cluster, args)

    # One job for the step: both tasks, two samples each, all done.
    (status,) = [j for j in jobs_of(served) if j["id"] not in before]
    assert status["state"] == "done" and status["counts"]["done"] == 4, status
    job_id = status["id"]

    # One Sample per rollout (one segment each), in the data source's order:
    # group by prompt, the group's Samples answered by samples s0, s1.
    assert [s.group_index for s in samples] == [0, 0, 1, 1]
    assert [s.index for s in samples] == [s.rollout_id for s in samples] == [0, 1, 2, 3]
    ids = [t["instance_id"] for t in tasks]
    assert [s.metadata["rollcall"]["rollout_id"].rsplit(".", 2)[0] for s in samples] == \
        [f"{job_id}.{ids[0]}"] * 2 + [f"{job_id}.{ids[1]}"] * 2
    assert [s.metadata["rollcall"]["rollout_id"].split(".")[-2] for s in samples] == ["s0", "s1", "s0", "s1"]
    assert [s.label for s in samples] == [ids[0]] * 2 + [ids[1]] * 2
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0, 0.0]
    assert all(s.status == Sample.Status.COMPLETED and not s.remove_sample for s in samples)
    check_token_exact(served, samples)

    # The train actors' rollout_data, as slime built it: the Samples' tokens
    # and masks, rewards normalized per group (here as slime's default does
    # it: one segment per rollout), one rollout per sample id.
    assert data["partition"] == [0, 1, 2, 3] and data["global_batch_sizes"] == [4]
    assert [t.tolist() for t in data["tokens"]] == [s.tokens for s in samples]
    assert [m.tolist() for m in data["loss_masks"]] == [s.loss_mask for s in samples]
    assert data["response_lengths"] == [s.response_length for s in samples]
    assert all(lp.tolist() == pytest.approx(s.rollout_log_probs) for lp, s in zip(data["rollout_log_probs"], samples))
    assert data["rollout_ids"] == [0, 1, 2, 3] and data["truncated"] == [0, 0, 0, 0]
    assert data["rollout_mask_sums"].tolist() == [sum(s.loss_mask) for s in samples]
    assert data["raw_reward"] == [1.0, 0.0, 0.0, 0.0]
    raw, default = slime_default_rewards(args, samples)
    assert data["rewards"] == pytest.approx(default) and raw == data["raw_reward"]
    assert data["rewards"] == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-4)

    # Evaluation (slime's eval_function_path defaults to the rollout
    # function): one job over the template's tasks, one sample each.
    out = call_rollout_fn(load_function(args.eval_function_path), args, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput)
    ev = out.data["rollcall"]
    assert ev["rewards"] == [1.0, 0.0] and ev["truncated"] == [False, False]
    assert [s.label for s in ev["samples"]] == sorted(ids)
    logged = log_eval_rollout_data(0, args, out.data, out.metrics)
    assert logged["eval/rollcall"] == 0.5 and logged["eval/rollcall-truncated_ratio"] == 0.0
    assert leftovers(job_id) == []


def test_codex_compaction_fans_out_into_segments(family, served, ray_cluster, tokenizer_dir, tmp_path,
                                                 monkeypatch):
    t = family[2]
    task = scripted(t, [LONG_ONCE, in_sample_0_inside(apply_b64(t["patch"]))])
    job = {"harness": "codex", "model": "scripted", "concurrency": 2, "timeout_secs": 300,
           "grade_timeout_secs": 300, "harness_args": COMPACT}
    args = slime_args(tmp_path, served.url, job, [task], tokenizer_dir, 2, monkeypatch)
    before = {j["id"] for j in jobs_of(served)}
    samples, data = rollout_step(ray_cluster, args)
    (status,) = [j for j in jobs_of(served) if j["id"] not in before]
    assert status["state"] == "done" and status["counts"]["done"] == 2, status

    # Each rollout summarized its context once: two segments, two Samples
    # sharing the rollout's rollout_id (its data-source index), contiguous,
    # both with the rollout's reward (1 for sample 0, which solved it).
    rids = [s.metadata["rollcall"]["rollout_id"] for s in samples]
    assert len(samples) == 4 and rids[0] == rids[1] != rids[2] == rids[3], rids
    assert [s.rollout_id for s in samples] == [s.index for s in samples] == [0, 0, 1, 1]
    assert [s.group_index for s in samples] == [0, 0, 0, 0]
    assert [s.metadata["rollcall"]["segment"] for s in samples] == [0, 1, 0, 1]
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0, 0.0] and ".s0." in rids[0]
    # The second segment starts from the summary, not from the first one's end.
    assert samples[1].tokens[:len(samples[0].tokens)] != samples[0].tokens
    check_token_exact(served, samples)

    # slime kept the rollouts whole: one step of 2 rollouts (the global
    # batch size counts rollouts) holds all 4 Samples; each sample's
    # denominator is its whole rollout's mask sum.
    assert data["rollout_ids"] == [0, 0, 1, 1] and data["global_batch_sizes"] == [2]
    assert sorted(data["partition"]) == [0, 1, 2, 3]
    sums = [sum(samples[0].loss_mask) + sum(samples[1].loss_mask)] * 2 + \
        [sum(samples[2].loss_mask) + sum(samples[3].loss_mask)] * 2
    assert data["rollout_mask_sums"].tolist() == sums

    # GRPO over the group's two rollouts, not its four segments: each
    # segment gets its rollout's value, the one slime's default gives when
    # each rollout is one Sample; slime's default on the segments would
    # weigh each rollout by its segment count (here: one group of four).
    raw, per_rollout = slime_default_rewards(args, [samples[0], samples[2]])
    assert data["rewards"] == pytest.approx([per_rollout[0]] * 2 + [per_rollout[1]] * 2)
    assert data["rewards"] == pytest.approx([0.7071, 0.7071, -0.7071, -0.7071], abs=1e-4)
    _, on_segments = slime_default_rewards(args, samples)
    assert on_segments != pytest.approx(data["rewards"], abs=1e-3)
    assert leftovers(status["id"]) == []


def test_a_rollout_without_tokens_is_removed_from_training(slime_src, tokenizer_dir, tmp_path, monkeypatch):
    """An infrastructure error (no tokens, no reward) in a group: one masked
    token marked `remove_sample`, with the group's mean reward, outside the
    normalization; slime's conversion masks it out."""
    from slime.ray.rollout import RolloutManager
    from slime.utils.misc import load_function
    from slime.utils.types import Sample

    from rollcall_data.slime import rollouts_of

    args = slime_args(tmp_path, "http://127.0.0.1:9", {"harness": "mini-swe-agent"}, [{"instance_id": "t"}],
                      tokenizer_dir, 3, monkeypatch)
    group = [Sample(group_index=0, index=i, prompt="t", metadata={"instance_id": "t"}) for i in range(3)]

    def sample(i: int, status: str, reward, response: list[int]) -> dict:
        segs = [{"segment": 0, "num_turns": 1, "prompt_ids": [1, 2], "response_ids": response,
                 "loss_mask": [1] * len(response), "logprobs": [-0.5] * len(response),
                 "sequences": [0], "policy_versions": [0]}] if response else []
        return {"rollout_id": f"J.t.s{i}.a0", "sample": i, "status": status, "reward": reward,
                "resolved": reward == 1.0, "policy_version": 0, "segments": segs}

    rollouts = rollouts_of(group, [sample(0, "completed", 1.0, [5, 6]), sample(1, "completed", 0.0, [7]),
                                   sample(2, "infra_error", None, [])], "J")
    assert [len(r) for r in rollouts] == [1, 1, 1]
    (removed,) = rollouts[2]
    assert removed.remove_sample and removed.status == Sample.Status.FAILED and removed.reward == 0.5
    assert removed.metadata["rollcall"]["rollout_id"] == "J.t.s2.a0" and removed.rollout_id == 2
    cls = RolloutManager.__ray_metadata__.modified_class
    manager = cls.__new__(cls)
    manager.args = args
    manager.custom_convert_samples_to_train_data_func = None
    manager.custom_reward_post_process_func = load_function(args.custom_reward_post_process_path)
    data = cls._convert_samples_to_train_data(manager, [s for r in rollouts for s in r])
    assert data["loss_masks"] == [[1, 1], [1], [0]] and data["rollout_ids"] == [0, 1, 2]
    assert data["tokens"] == [[1, 2, 5, 6], [1, 2, 7], [0, 0]]
    assert data["rewards"] == pytest.approx([0.7071, -0.7071, 0.0], abs=1e-4)


def test_slimes_plugin_contracts_take_the_adapter(slime_src):
    """slime's own plugin contract tests (tests/plugin_contracts, run by its
    CI without GPUs) on the adapter's functions: the reward post-process
    hook's signature and call, and the rollout function's signature against
    slime's default rollout function."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([slime_src, str(h.REPO_ROOT / "python")]),
               SLIME_CONTRACT_CUSTOM_REWARD_POST_PROCESS_PATH="rollcall_data.slime.reward_post_process")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/plugin_contracts/test_plugin_runtime_hook_contracts.py", "-k", "reward_post_process"],
                       cwd=slime_src, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    check = ("from plugin_contracts.test_plugin_rollout_contracts import assert_rollout_function_signature_matches_default"
             " as check\nfrom slime.utils.misc import load_function\n"
             "check(load_function('rollcall_data.slime.generate_rollout'))\nprint('signature ok')\n")
    r = subprocess.run([sys.executable, "-c", check], cwd=Path(slime_src) / "tests",
                       env=dict(env, PYTHONPATH=os.pathsep.join([str(Path(slime_src) / "tests"), env["PYTHONPATH"]])),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "signature ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
