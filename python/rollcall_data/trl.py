"""TRL: rows of `rollcall export rl --trainer trl` are what a GRPOTrainer
`rollout_func` returns (`prompt_ids`, `completion_ids`, `logprobs`,
`env_mask`) plus `reward`; `rollout_func` replays them group by group."""

from __future__ import annotations

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
