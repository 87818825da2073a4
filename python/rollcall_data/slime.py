"""slime: rows of `rollcall export rl --trainer slime` are `Sample` fields
exactly (`Sample.from_dict(row)`, which makes `status` a `Sample.Status`), with slime's status
values and integer rollout ids; rollcall's own columns are under
`metadata`. `save_rollout` writes the file slime's
`--load-debug-rollout-data` (and `forge_load`) reads.

Online, against `rollcall serve`'s job API: `generate_rollout` is a
`--rollout-function-path` (one job per rollout step, one `Sample` per
segment, the segments of a rollout sharing its `rollout_id`) and
`reward_post_process` a `--custom-reward-post-process-path` that normalizes
each group over its rollouts, not its segments (docs/jobs.md)."""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path

from . import rows as _rows

logger = logging.getLogger(__name__)


def samples(path: str | Path) -> list[dict]:
    """The rows, as `Sample.to_dict()` records."""
    return _rows(path)


def save_rollout(path: str | Path, out: str | Path, rollout_id: int = 0) -> Path:
    """Write `torch.save({"rollout_id": rollout_id, "samples": [...]}, out)`.

    Raises ValueError on a sample without a reward (slime's reward
    post-processing cannot take None: export with `--missing-reward drop`
    or `zero`)."""
    import torch

    recs = samples(path)
    for s in recs:
        if s.get("reward") is None:
            raise ValueError(f"{s['metadata']['sample_id']} has no reward: export with --missing-reward drop or zero")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": recs}, out)
    return out


# ------------------------------------------------------------------ online
#
# slime's rollout function against a running `rollcall serve`: each rollout
# step's prompts become one job (their tasks, `n_samples_per_prompt` samples
# each), and the job's graded groups come back as slime `Sample`s, one per
# segment. Written against slime at commit
# 624b824a898ab0ec1fcb4d373004c7f3852bf515 (not on PyPI): slime is imported
# inside the functions, so this module imports without it.
#
#     --rollout-function-path rollcall_data.slime.generate_rollout
#     --custom-reward-post-process-path rollcall_data.slime.reward_post_process
#     --custom-config-path rollcall.yaml     # rollcall_url: ..., rollcall_job: {...}

#: slime's advantage estimators whose rewards its default post-process
#: centers per group, and those it also divides by the group's std
#: (`RolloutManager._post_process_rewards`).
GROUP_NORMALIZED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED = ("grpo", "gspo", "cispo")

#: slime's `Sample.Status` value for a job sample's status, as
#: `rollcall export rl --trainer slime` maps it (docs/datasets.md).
STATUS = {"completed": "completed", "timeout": "truncated", "cancelled": "aborted", "infra_error": "failed"}


def _setting(args, name: str, env: str):
    value = getattr(args, name, None) if args is not None else None
    return value if value is not None else os.environ.get(env)


def _template(value, what: str) -> dict:
    """A job template given as a mapping (the custom config's YAML), JSON
    text, or the path of a JSON or YAML file."""
    if value is None:
        raise ValueError(f"no {what}: set it in --custom-config-path's YAML or in the environment")
    if isinstance(value, dict):
        return dict(value)
    text = str(value)
    if not text.lstrip().startswith("{"):
        path = Path(text)
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            return dict(yaml.safe_load(text))
    return dict(json.loads(text))


def config(args=None) -> tuple[str, dict]:
    """The rollcall URL and job template for slime's `args`: `rollcall_url`
    and `rollcall_job` (set by `--custom-config-path`'s YAML), else the
    environment's `ROLLCALL_URL` and `ROLLCALL_JOB` (JSON, or a JSON or
    YAML file's path). The admin key comes from `ROLLCALL_ADMIN_KEY`."""
    url = _setting(args, "rollcall_url", "ROLLCALL_URL")
    if not url:
        raise ValueError("no rollcall URL: set rollcall_url in --custom-config-path's YAML or ROLLCALL_URL")
    job = _template(_setting(args, "rollcall_job", "ROLLCALL_JOB"), "rollcall job template (rollcall_job)")
    if "adaptive" in job:
        raise ValueError("slime's groups have n_samples_per_prompt samples: leave `adaptive` out of the job")
    return str(url), job


def task_of(sample) -> str:
    """The task a data-source sample names: its `metadata["instance_id"]`,
    else its label, else its prompt (as slime's SWE example reads them)."""
    meta = sample.metadata or {}
    for value in (meta.get("instance_id"), sample.label, sample.prompt):
        if isinstance(value, str) and value:
            return value
    raise ValueError(f"sample {sample.index} names no task: give metadata.instance_id (--metadata-key), "
                     "a label (--label-key) or a prompt that is the instance id")


def _segment_sample(base, sample: dict, seg: dict, meta: dict):
    from slime.utils.types import Sample

    s = copy.deepcopy(base)
    s.tokens = [int(t) for t in seg["prompt_ids"]] + [int(t) for t in seg["response_ids"]]
    s.response_length = len(seg["response_ids"])
    s.loss_mask = [int(m) for m in seg["loss_mask"]]
    s.rollout_log_probs = [0.0 if x is None else float(x) for x in seg["logprobs"]]
    s.reward = float(sample["reward"])
    s.status = Sample.Status(STATUS.get(sample["status"], "failed"))
    s.metadata = {**(base.metadata or {}), "rollcall": dict(meta, segment=seg["segment"],
                                                            num_turns=seg["num_turns"],
                                                            policy_versions=seg["policy_versions"])}
    return s


def _placeholder(base, sample: dict, reward: float, meta: dict):
    """A rollout without tokens or reward (an infrastructure error): one
    masked token, removed from training (`remove_sample`), with its group's
    mean reward, as slime's own agent examples return an aborted sample."""
    from slime.utils.types import Sample

    s = copy.deepcopy(base)
    s.tokens, s.response_length, s.loss_mask, s.rollout_log_probs = [0, 0], 1, [0], [0.0]
    s.reward = reward
    s.remove_sample = True
    status = STATUS.get(sample["status"], "aborted")
    s.status = Sample.Status("failed" if status == "completed" else status)
    s.metadata = {**(base.metadata or {}), "rollcall": dict(meta, segment=0)}
    return s


def rollouts_of(group: list, samples: list[dict], job: str) -> list[list]:
    """slime `Sample`s for one data-source group (`n_samples_per_prompt`
    Samples of one prompt) and the job samples answering it: per rollout,
    a list with one Sample per segment (a copy of the prompt's Sample with
    `tokens` = the segment's prompt + response ids, `loss_mask`,
    `rollout_log_probs`, the graded `reward` and slime's `status`), every
    segment of a rollout sharing `rollout_id` (the prompt Sample's own, else
    its `index`), as slime's fan-out (`custom_generate` returning
    `list[Sample]`) has them."""
    graded = [s["reward"] for s in samples if s["reward"] is not None]
    neutral = sum(graded) / len(graded) if graded else 0.0
    out = []
    for base, sample in zip(group, samples, strict=True):
        rid = base.rollout_id if base.rollout_id is not None else base.index
        meta = {"job": job, "rollout_id": sample["rollout_id"], "sample": sample["sample"],
                "status": sample["status"], "resolved": sample["resolved"],
                "policy_version": sample["policy_version"], "segments": len(sample["segments"])}
        segs = [seg for seg in sample["segments"] if seg["response_ids"]]
        if sample["reward"] is None or not segs:
            rollout = [_placeholder(base, sample, neutral, meta)]
        else:
            rollout = [_segment_sample(base, sample, seg, meta) for seg in segs]
        for s in rollout:
            s.rollout_id = rid
        out.append(rollout)
    return out


def _run_job(client, job: dict, deadline: float) -> tuple[str, dict[str, list[dict]]]:
    job_id = client.submit(job)
    logger.info("rollcall job %s: %d tasks, %d samples each", job_id, len(job.get("instances") or []),
                job.get("samples", 0))
    by_task: dict[str, list[dict]] = {}
    for g in client.groups(job_id, deadline=deadline):
        by_task.setdefault(g["task"], []).extend(sorted(g["samples"], key=lambda s: s["sample"]))
    return job_id, by_task


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime's `--rollout-function-path`: one job per rollout step.

    Takes `args.rollout_batch_size` groups from `data_source` (each
    `n_samples_per_prompt` Samples of one prompt, naming its task: see
    `task_of`), submits one job for their tasks with that many samples each,
    and returns `RolloutFnTrainOutput` with, per group, its rollouts, each a
    list of Samples, one per segment (`rollouts_of`). With `evaluation`, runs
    the eval job template (`rollcall_eval_job`, else `rollcall_job`) over its
    tasks, `n_samples_per_eval_prompt` samples each, and returns
    `RolloutFnEvalOutput` under the name `rollcall` (one Sample per graded
    rollout: its first segment). `rollcall_deadline` (seconds, default
    3600; or `ROLLCALL_DEADLINE`) bounds the wait for the job's end."""
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
    from slime.utils.types import Sample

    from .jobs import Client

    url, template = config(args)
    client = Client(url)
    deadline = float(_setting(args, "rollcall_deadline", "ROLLCALL_DEADLINE") or 3600.0)
    if evaluation:
        eval_template = _setting(args, "rollcall_eval_job", "ROLLCALL_EVAL_JOB")
        job = _template(eval_template, "eval job template") if eval_template is not None else template
        n = int(getattr(args, "n_samples_per_eval_prompt", None) or 1)
        job = {k: v for k, v in job.items() if k not in ("samples", "min_policy_version", "key", "adaptive")}
        job_id, by_task = _run_job(client, dict(job, samples=n), deadline)
        samples, skipped = [], 0
        for gi, task in enumerate(sorted(by_task)):
            for sample in by_task[task]:
                base = Sample(group_index=gi, index=len(samples), prompt=task, label=task,
                              metadata={"instance_id": task})
                if sample["reward"] is None or not any(seg["response_ids"] for seg in sample["segments"]):
                    skipped += 1
                    continue
                samples.append(rollouts_of([base], [sample], job_id)[0][0])
        data = {"rewards": [s.reward for s in samples],
                "truncated": [s.status == Sample.Status.TRUNCATED for s in samples], "samples": samples}
        return RolloutFnEvalOutput(data={"rollcall": data}, metrics={"rollcall/eval_without_reward": skipped})

    groups = data_source.get_samples(int(args.rollout_batch_size))
    if not groups:
        raise ValueError("the data source gave no samples")
    tasks = [task_of(g[0]) for g in groups]
    for g, task in zip(groups, tasks):
        others = {task_of(s) for s in g} - {task}
        if others:
            raise ValueError(f"group {g[0].group_index} names tasks {sorted({task} | others)}: one task per group")
    n = len(groups[0])
    if any(len(g) != n for g in groups):
        raise ValueError(f"groups of {sorted({len(g) for g in groups})} samples: one job needs groups of one size")
    repeats = max(tasks.count(t) for t in tasks)
    job = {k: v for k, v in template.items() if k not in ("instances", "samples", "min_policy_version", "key")}
    job_id, by_task = _run_job(client, dict(job, instances=sorted(set(tasks)), samples=n * repeats), deadline)
    used: dict[str, int] = {}
    out = []
    for g, task in zip(groups, tasks):
        start = used.get(task, 0)
        got = by_task.get(task, [])[start:start + n]
        if len(got) < n:
            raise ValueError(f"job {job_id} gave {len(got)} samples for task {task!r}, not {n}")
        used[task] = start + n
        out.append(rollouts_of(g, got, job_id))
    rollouts = [r for g in out for r in g]
    metrics = {
        "rollcall/rollouts": len(rollouts),
        "rollcall/segments": sum(len(r) for r in rollouts),
        "rollcall/removed": sum(r[0].remove_sample for r in rollouts),
        "rollcall/resolved": sum(bool(r[0].metadata["rollcall"]["resolved"]) for r in rollouts),
    }
    return RolloutFnTrainOutput(samples=out, metrics=metrics)


def _reward(args, sample) -> float:
    key = getattr(args, "reward_key", None)
    return sample.reward if not key else sample.reward[key]


def reward_post_process(args, samples):
    """slime's `--custom-reward-post-process-path` for rollouts that fan out
    into segments: `(raw_rewards, rewards)` for the flat `samples`, where
    slime's group normalization (centered per group, divided by the group's
    std for GRPO, GSPO and CISPO, as its default under
    `--advantage-estimator` and `--rewards-normalization`) is computed over
    each group's rollouts (`group_index`), one reward per rollout
    (`rollout_id`, else `index`), not over its segments: every segment gets
    its rollout's value. Rollouts marked `remove_sample` take no part and
    get 0."""
    import torch

    raw = [_reward(args, s) for s in samples]
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in GROUP_NORMALIZED or not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    use_std = estimator in STD_NORMALIZED and getattr(args, "grpo_std_normalization", True)
    groups: dict = {}
    for i, s in enumerate(samples):
        rid = s.rollout_id if s.rollout_id is not None else (s.index if s.index is not None else ("sample", i))
        rollouts = groups.setdefault(s.group_index, {})
        rollouts.setdefault(rid, []).append(i)
    out = [0.0] * len(samples)
    for rollouts in groups.values():
        kept = [idx for idx in rollouts.values() if not samples[idx[0]].remove_sample]
        if not kept:
            continue
        rewards = torch.tensor([raw[idx[0]] for idx in kept], dtype=torch.float)
        rewards = rewards - rewards.mean()
        if use_std and len(kept) > 1:
            rewards = rewards / (rewards.std() + 1e-6)
        for idx, value in zip(kept, rewards.tolist(), strict=True):
            for i in idx:
                out[i] = value
    return raw, out
