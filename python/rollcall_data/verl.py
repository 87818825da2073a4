"""verl: rows of `rollcall export rl --trainer verl` are `AgentLoopOutput`
fields exactly (`AgentLoopOutput(**row)`); `batch` pads them into the
tensors verl's PPO/GRPO trainer consumes."""

from __future__ import annotations

from pathlib import Path

from . import rows as _rows


def batch(path: str | Path, pad_token_id: int = 0) -> dict:
    """The padded batch of an export, as `DataProto.from_single_dict` takes it.

    Tensors (torch): `prompts` (left-padded), `responses` and
    `response_mask` (right-padded), `input_ids`, `attention_mask`,
    `position_ids`, `rollout_log_probs` (0 on padding), and
    `token_level_rewards` / `token_level_scores` (the reward on the last
    response token, as verl's reward loop places it). Numpy object arrays:
    `uid` (the group GRPO normalizes within) and `sample_id`.

    Raises ValueError on a row with no reward (export with
    `--missing-reward drop|zero`) or an empty response."""
    import numpy as np
    import torch

    samples = _rows(path)
    if not samples:
        raise ValueError(f"{path} has no rows")
    for s in samples:
        if s["reward_score"] is None:
            raise ValueError(f"{s['extra_fields']['sample_id']} has no reward: export with --missing-reward drop or zero")
        if not s["response_ids"]:
            raise ValueError(f"{s['extra_fields']['sample_id']} has an empty response")
    n = len(samples)
    plen = max(len(s["prompt_ids"]) for s in samples)
    rlen = max(len(s["response_ids"]) for s in samples)
    prompts = torch.full((n, plen), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((n, plen), dtype=torch.int64)
    responses = torch.full((n, rlen), pad_token_id, dtype=torch.int64)
    response_mask = torch.zeros((n, rlen), dtype=torch.int64)
    response_attn = torch.zeros((n, rlen), dtype=torch.int64)
    logprobs = torch.zeros((n, rlen), dtype=torch.float32)
    scores = torch.zeros((n, rlen), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = s["prompt_ids"], s["response_ids"]
        prompts[i, plen - len(p):] = torch.tensor(p, dtype=torch.int64)
        prompt_mask[i, plen - len(p):] = 1
        responses[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
        response_mask[i, : len(r)] = torch.tensor(s["response_mask"], dtype=torch.int64)
        response_attn[i, : len(r)] = 1
        lp = s["response_logprobs"] or [0.0] * len(r)
        logprobs[i, : len(r)] = torch.tensor(lp, dtype=torch.float32)
        scores[i, len(r) - 1] = float(s["reward_score"])
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "rollout_log_probs": logprobs,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "uid": np.array([s["extra_fields"]["uid"] for s in samples], dtype=object),
        "sample_id": np.array([s["extra_fields"]["sample_id"] for s in samples], dtype=object),
    }

