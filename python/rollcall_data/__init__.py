"""Load rollcall's dataset exports (`rollcall export rl|sft`) into the
trainers' own entry points, with no glue of your own.

Most shapes load with the trainers' code alone (see `docs/datasets.md`);
this package holds the few steps that need torch or a trainer's calling
convention:

- `rollcall_data.verl.batch(path)`: the padded batch verl's trainer
  consumes (`DataProto.from_single_dict(batch(path))`);
- `rollcall_data.trl.rollout_func(path, num_generations)`: a GRPOTrainer
  `rollout_func` that replays exported groups, and `trl.reward`;
- `rollcall_data.slime.save_rollout(path, out)`: the
  `torch.save({"rollout_id", "samples"})` file slime's
  `--load-debug-rollout-data` reads.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["rows", "groups"]


def rows(path: str | Path) -> list[dict]:
    """The rows of an export (a Parquet file), as Python dicts."""
    import pyarrow.parquet as pq

    return pq.read_table(str(path)).to_pylist()


def groups(samples: list[dict], key: str) -> list[list[dict]]:
    """Split rows into their groups, which rollcall writes contiguously.

    Raises ValueError if a group's rows are not contiguous (an export that
    was reordered after rollcall wrote it)."""
    out: list[list[dict]] = []
    seen: set = set()
    for s in samples:
        k = s[key]
        if out and out[-1][0][key] == k:
            out[-1].append(s)
            continue
        if k in seen:
            raise ValueError(f"group {k!r} is not contiguous: was the export reordered?")
        seen.add(k)
        out.append([s])
    return out
