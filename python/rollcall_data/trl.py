"""TRL: rows of `rollcall export rl --trainer trl` are what a GRPOTrainer
`rollout_func` returns (`prompt_ids`, `completion_ids`, `logprobs`,
`env_mask`) plus `reward`; `rollout_func` replays them group by group."""

from __future__ import annotations

import json
from pathlib import Path

from . import groups as _groups
from . import rows as _rows

#: Columns a rollout_func hands to GRPOTrainer (the rest go to reward functions).
ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask")


def rollout_func(path: str | Path, num_generations: int):
    """A GRPOTrainer `rollout_func` that replays the export's groups in order.

    GRPOTrainer hands it each prompt `num_generations` times in a row (its
    RepeatSampler); each such block is answered with the next exported group,
    so export with `--group-size N`, N = `num_generations`. Every column is
    passed on: `reward` (and rollcall's columns) reach the reward functions
    as keyword arguments; use `reward` below. Raises ValueError when a group
    does not have `num_generations` samples, a call does not ask for whole
    groups, or the export runs out of groups."""
    gs = _groups(_rows(path), "group")
    for g in gs:
        if len(g) != num_generations:
            raise ValueError(f"group {g[0]['group']!r} has {len(g)} samples, not {num_generations}: "
                             f"export with --group-size {num_generations}")
    state = {"next": 0}

    def replay(prompts: list, trainer=None) -> dict:
        if len(prompts) % num_generations:
            raise ValueError(f"{len(prompts)} prompts is not a whole number of groups of {num_generations}")
        out: dict[str, list] = {}
        for _ in range(len(prompts) // num_generations):
            if state["next"] >= len(gs):
                raise ValueError(f"{path}: all {len(gs)} groups replayed")
            for s in gs[state["next"]]:
                for k, v in s.items():
                    out.setdefault(k, []).append(v)
            state["next"] += 1
        return out

    return replay


def reward(prompts=None, completions=None, reward=None, **kwargs) -> list[float | None]:
    """A GRPO reward function returning the exported rewards."""
    return list(reward)


def prompts(path: str | Path):
    """A `datasets.Dataset` with one `prompt` per exported group (its group
    key), the train_dataset GRPOTrainer needs to ask `rollout_func` for
    groups. The prompt text is not used: the replay answers blocks in
    export order."""
    import datasets

    keys = [g[0]["group"] for g in _groups(_rows(path), "group")]
    return datasets.Dataset.from_dict({"prompt": keys})


# ------------------------------------------------------------------ online
#
# GRPO against a running `rollcall serve`: each step's prompts become one job
# (its tasks, `num_generations` samples each, sampled under the weights of
# the step before), the job's graded groups come back through the job API in
# training shape, and after each optimizer step the weights go to the route
# (`POST /v1/admin/load`) as the next policy version. Written against TRL
# 1.16's `GRPOTrainer(rollout_func=...)`.


class Online:
    """Everything GRPOTrainer needs to train on rollcall's rollouts online.

    `url` is the rollcall server, `job` the job template (`POST /v1/jobs`'s
    body without `instances`, `samples` and `min_policy_version`, which
    each step sets). Use `train_dataset=online.prompts()`,
    `rollout_func=online.rollout_func`, `reward_funcs=online.reward` and
    `callbacks=[online.callback()]`. The admin key comes from
    `ROLLCALL_ADMIN_KEY` (or `key=`); `route` names the route to load
    weights into when the server has several. Step N's weights are policy
    version `first_version` + N; set `first_version` to the route's current
    version when the model starts from weights already loaded (after SFT)."""

    def __init__(self, url: str, job: dict, key: str | None = None, route: str | None = None,
                 deadline: float = 3600.0, first_version: int = 0):
        from .jobs import Client

        if "adaptive" in job:
            raise ValueError("GRPO needs groups of num_generations samples: leave `adaptive` out of the job")
        self.client = Client(url, key)
        self.job = {k: v for k, v in job.items() if k not in ("instances", "samples", "min_policy_version")}
        self.route = route
        self.deadline = deadline
        self.first_version = int(first_version)
        #: Per step: the job id and the rows handed to the trainer.
        self.steps: list[dict] = []

    def task_ids(self) -> list[str]:
        tasks = self.job["tasks"]
        if isinstance(tasks, list):
            return [t["instance_id"] for t in tasks]
        path = Path(tasks)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path, columns=["instance_id"]).column(0).to_pylist()
        text = path.read_text()
        try:
            items = json.loads(text)
            items = items if isinstance(items, list) else [items]
        except ValueError:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [t["instance_id"] for t in items]

    def prompts(self):
        """A `datasets.Dataset` with one `prompt` per task: its instance id."""
        import datasets

        return datasets.Dataset.from_dict({"prompt": self.task_ids()})

    def rollout_func(self, prompts: list, trainer) -> dict:
        n = trainer.num_generations
        if len(prompts) % n:
            raise ValueError(f"{len(prompts)} prompts is not a whole number of groups of {n}")
        tasks = []
        for i in range(0, len(prompts), n):
            block = prompts[i:i + n]
            if len(set(block)) != 1:
                raise ValueError(f"prompts {block} are not one prompt repeated {n} times")
            tasks.append(block[0])
        version = self.first_version + int(trainer.state.global_step)
        job = dict(self.job, instances=sorted(set(tasks)), samples=n, min_policy_version=version)
        job_id = self.client.submit(job)
        by_task = {g["task"]: g for g in self.client.groups(job_id, deadline=self.deadline)}
        out: dict[str, list] = {}
        used: dict[str, int] = {}
        for task in tasks:
            g = by_task.get(task)
            if g is None or len(g["samples"]) < used.get(task, 0) + n:
                raise ValueError(f"job {job_id} gave no whole group of {n} for task {task!r}")
            samples = g["samples"][used.get(task, 0):used.get(task, 0) + n]
            used[task] = used.get(task, 0) + n
            graded = [s["reward"] for s in samples if s["reward"] is not None]
            neutral = sum(graded) / len(graded) if graded else 0.0
            for s in samples:
                for k, v in _row(s, neutral, trainer).items():
                    out.setdefault(k, []).append(v)
        self.steps.append({"job": job_id, "policy_version": version, "rows": out})
        return out

    @staticmethod
    def reward(prompts=None, completions=None, reward=None, **kwargs) -> list[float]:
        """The graded rewards, as the rows carry them."""
        return [float(r) for r in reward]

    def callback(self):
        """A TrainerCallback that loads the weights into the route after every
        optimizer step, as policy version `first_version` + the step number."""
        from transformers import TrainerCallback

        online = self

        class PushWeights(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
                step = int(state.global_step)
                root = Path(args.output_dir) / "rollcall-weights"
                path = root / f"step-{step}"
                model.save_pretrained(path)
                tok = processing_class or kw.get("tokenizer")
                if tok is not None:
                    tok.save_pretrained(path)
                online.client.load(str(path.resolve()), policy_version=online.first_version + step,
                                   route=online.route)
                for old in root.glob("step-*"):
                    if old != path:
                        import shutil

                        shutil.rmtree(old, ignore_errors=True)

        return PushWeights()


def _row(sample: dict, neutral: float, trainer) -> dict:
    """One GRPO row from a sample: its first segment (the whole rollout
    unless its context was rewritten), the loss mask as `env_mask`. A sample
    with no tokens (an infrastructure error) becomes one masked token with
    its group's mean reward, which gives it no advantage and no gradient."""
    segs = sample["segments"]
    if sample["reward"] is None or not segs or not segs[0]["response_ids"]:
        eos = trainer.processing_class.eos_token_id
        seg = {"prompt_ids": [eos], "response_ids": [eos], "loss_mask": [0], "logprobs": [0.0]}
        reward = neutral
    else:
        seg = segs[0]
        reward = sample["reward"]
    return {
        "prompt_ids": list(seg["prompt_ids"]),
        "completion_ids": list(seg["response_ids"]),
        "logprobs": [0.0 if x is None else float(x) for x in seg["logprobs"]],
        "env_mask": list(seg["loss_mask"]),
        "reward": reward,
        "rollout_id": sample["rollout_id"],
        "policy_version": sample.get("policy_version"),
    }
