"""An agent loop for verl's AgentLoopManager that takes its rollouts from
rollcall's job API: written against verl 0.9.1
(`verl.experimental.agent_loop`), registered by YAML:

    # agent_loops.yaml, named by actor_rollout_ref.rollout.agent.agent_loop_config_path
    - name: rollcall
      _target_: rollcall_data.verl_agent.RollcallAgentLoop
      url: http://127.0.0.1:8700
      job: {tasks: /data/tasks.jsonl, harness: mini-swe-agent, model: policy}

and chosen per row by the dataset's `agent_name` column (`rollcall`). Each
row names its task (`extra_info.instance_id`, else an `instance_id`
column); verl runs the row `rollout.n` times under one `uid`. The first of
those runs to ask submits one job for the task with `n` samples, keyed by
the uid (`key`: the others get the same job, from any worker process), and
each run claims one sample of the finished group (`POST
/v1/jobs/{id}/claim`), which it returns as verl's `AgentLoopOutput`. The
admin key comes from `ROLLCALL_ADMIN_KEY` (or `key:`).
"""

from __future__ import annotations

import asyncio

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from .jobs import Client


def output_of(sample: dict, uid: str) -> AgentLoopOutput:
    """verl's `AgentLoopOutput` for one sample of a job's group: its first
    segment, the loss mask as `response_mask`, the graded reward as
    `reward_score`, verl's `uid` in `extra_fields`. Raises ValueError on a
    sample without tokens or reward (an infrastructure error)."""
    segs = sample["segments"]
    if not segs or not segs[0]["response_ids"] or sample["reward"] is None:
        raise ValueError(f"{sample['rollout_id']} ({sample['status']}) has no tokens or no reward")
    seg = segs[0]
    return AgentLoopOutput(
        prompt_ids=list(seg["prompt_ids"]),
        response_ids=list(seg["response_ids"]),
        response_mask=list(seg["loss_mask"]),
        response_logprobs=[0.0 if x is None else float(x) for x in seg["logprobs"]],
        reward_score=float(sample["reward"]),
        num_turns=int(seg["num_turns"]),
        metrics=AgentLoopMetrics(),
        extra_fields={"uid": uid, "rollout_id": sample["rollout_id"],
                      "policy_version": sample["policy_version"], "status": sample["status"]},
    )


class RollcallAgentLoop(AgentLoopBase):
    def __init__(self, *args, url: str, job: dict, key: str | None = None, claim_wait: float = 3600.0, **kwargs):
        super().__init__(*args, **kwargs)
        from omegaconf import OmegaConf

        self.client = Client(url, key)
        if OmegaConf.is_config(job):  # as hydra hands over the YAML's mapping
            job = OmegaConf.to_container(job, resolve=True)
        self.job = {k: v for k, v in dict(job).items() if k not in ("instances", "samples", "key")}
        self.claim_wait = claim_wait

    async def run(self, sampling_params: dict, **kwargs) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") or {}
        task = extra.get("instance_id") or kwargs.get("instance_id")
        if not task:
            raise ValueError("the row names no task: give extra_info.instance_id (or an instance_id column)")
        uid = str(kwargs["uid"])
        n = int(self.rollout_config.n)
        job = dict(self.job, instances=[task], samples=n, key=f"verl-{uid}")
        loop = asyncio.get_running_loop()
        job_id = (await loop.run_in_executor(None, self.client.call, "POST", "/v1/jobs", job))["id"]
        deadline = loop.time() + self.claim_wait
        while True:
            got = await loop.run_in_executor(
                None, lambda: self.client.call("POST", f"/v1/jobs/{job_id}/claim", {"task": task, "wait": 30}))
            if got.get("sample"):
                return output_of(got["sample"], uid)
            if loop.time() > deadline:
                raise TimeoutError(f"job {job_id}: no group for {task} within {self.claim_wait} s")
