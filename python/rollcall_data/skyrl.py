"""SkyRL: a generator whose rollouts are rollcall jobs. Written against skyrl
0.3.0 (PyPI; `skyrl.train.generators.base.GeneratorInterface`):

    from rollcall_data.skyrl import RollcallGenerator

    generator = RollcallGenerator("http://127.0.0.1:8700",
                                  {"tasks": "/data/tasks.jsonl", "harness": "mini-swe-agent", "model": "policy"})

handed to SkyRL's trainer where its own generator would be (the `generator`
of `RayPPOTrainer`, e.g. from an overridden `BasePPOExp.get_generator`).

Each `generate(input_batch)` submits one job: the batch's tasks, each row
naming its task in `env_extras["instance_id"]` (a column of the dataset;
else the prompt's last message is the instance id), as many samples per
task as the batch repeats it (SkyRL repeats each prompt
`n_samples_per_prompt` times). The job's graded groups come back as
SkyRL's `GeneratorOutput`, in the batch's order: one row per segment of a
rollout (`export::rl`'s segments; a rollout has several when its harness
rewrote its context), all of a rollout's rows carrying its
`trajectory_ids` entry and its reward, `is_last_step` true on the last.
Where every rollout has one segment there is one row per prompt, as SkyRL
wants without step-wise training; else train with
`generator.step_wise_trajectories=true`.

The model is the template's route; sampling params are the harness's and
the route's, not SkyRL's. The admin key comes from `ROLLCALL_ADMIN_KEY` (or
`key=`).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput, TrajectoryID

from .jobs import Client


def task_of(prompt, extras: dict | None) -> str:
    """The instance id a row names: `env_extras["instance_id"]`, else the
    prompt's text (a string, or its last message's content)."""
    if extras and extras.get("instance_id"):
        return str(extras["instance_id"])
    if isinstance(prompt, list) and prompt:
        prompt = prompt[-1].get("content")
    if isinstance(prompt, str) and prompt.strip():
        return prompt.strip()
    raise ValueError("the row names no task: give an instance_id column (env_extras) or the id as the prompt")


def rows_of(sample: dict, neutral: float) -> list[dict]:
    """SkyRL rows of one sample: one per segment with tokens. A sample with
    none (an infrastructure error) or no reward becomes one masked token
    (id 0) with its group's mean reward: no advantage, no gradient."""
    segs = [s for s in sample["segments"] if s["response_ids"]]
    stop = "stop" if sample["status"] == "completed" else sample["status"]
    if sample["reward"] is None or not segs:
        return [{"prompt_token_ids": [0], "response_ids": [0], "loss_masks": [0], "logprobs": [0.0],
                 "rewards": neutral, "stop_reasons": stop}]
    return [{"prompt_token_ids": list(s["prompt_ids"]), "response_ids": list(s["response_ids"]),
             "loss_masks": list(s["loss_mask"]), "logprobs": list(s["logprobs"]),
             "rewards": float(sample["reward"]), "stop_reasons": stop} for s in segs]


class RollcallGenerator(GeneratorInterface):
    """SkyRL's `GeneratorInterface` over `rollcall serve`'s job API. `url`
    is the rollcall server, `job` the job template (`POST /v1/jobs`'s body
    without `instances` and `samples`, which each batch sets)."""

    def __init__(self, url: str, job: dict, key: str | None = None):
        if "adaptive" in job:
            raise ValueError("SkyRL wants n_samples_per_prompt samples per prompt: leave `adaptive` out of the job")
        self.client = Client(url, key)
        self.job = {k: v for k, v in dict(job).items() if k not in ("instances", "samples")}
        #: Per batch: the job id and, per output row, its rollout id.
        self.jobs: list[dict] = []

    def _run(self, job: dict) -> tuple[str, dict[str, dict]]:
        job_id = self.client.submit(job)
        return job_id, {g["task"]: g for g in self.client.groups(job_id)}

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        prompts = input_batch["prompts"]
        extras = input_batch.get("env_extras") or [None] * len(prompts)
        tasks = [task_of(p, e) for p, e in zip(prompts, extras)]
        traj = input_batch.get("trajectory_ids")
        if traj is None:
            seen: Counter = Counter()
            traj = []
            for t in tasks:
                traj.append(TrajectoryID(instance_id=t, repetition_id=seen[t]))
                seen[t] += 1
        counts = Counter(tasks)
        job = dict(self.job, instances=sorted(counts), samples=max(counts.values()))
        job_id, groups = await asyncio.get_running_loop().run_in_executor(None, self._run, job)

        out: dict[str, list] = {k: [] for k in ("prompt_token_ids", "response_ids", "loss_masks", "logprobs",
                                                "rewards", "stop_reasons", "trajectory_ids", "is_last_step")}
        rollout_ids: list[str] = []
        used: Counter = Counter()
        for task, tid in zip(tasks, traj):
            g = groups.get(task)
            if g is None or len(g["samples"]) <= used[task]:
                raise ValueError(f"job {job_id} gave no sample {used[task]} for task {task!r}")
            sample = g["samples"][used[task]]
            used[task] += 1
            graded = [s["reward"] for s in g["samples"] if s["reward"] is not None]
            rows = rows_of(sample, sum(graded) / len(graded) if graded else 0.0)
            for i, row in enumerate(rows):
                for k, v in row.items():
                    out[k].append(v)
                out["trajectory_ids"].append(tid)
                out["is_last_step"].append(i == len(rows) - 1)
                rollout_ids.append(sample["rollout_id"])
        # Logprobs only when every sampled token has one (observations are 0.0).
        logprobs = out.pop("logprobs")
        complete = all(x is not None for lp, m in zip(logprobs, out["loss_masks"]) for x, k in zip(lp, m) if k)
        self.jobs.append({"job": job_id, "rollout_ids": rollout_ids})
        return {
            **out,
            "rollout_logprobs": [[0.0 if x is None else float(x) for x in lp] for lp in logprobs] if complete else None,
            "rollout_metrics": {
                "rollcall/rollouts": len(tasks),
                "rollcall/rows": len(rollout_ids),
                "rollcall/infra_errors": sum(1 for s in out["stop_reasons"] if s == "infra_error"),
            },
            "trajectory_generation_times": None,
            "rollout_expert_indices": None,
            "env_metrics": None,
        }
