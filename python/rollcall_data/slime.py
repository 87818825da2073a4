"""slime: rows of `rollcall export rl --trainer slime` are `Sample` fields
exactly (`Sample.from_dict(row)`, which makes `status` a `Sample.Status`), with slime's status
values and integer rollout ids; rollcall's own columns are under
`metadata`. `save_rollout` writes the file slime's
`--load-debug-rollout-data` (and `forge_load`) reads."""

from __future__ import annotations

from pathlib import Path

from . import rows as _rows


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
