"""The recipes' throughput (`make bench`), measured in one run and printed as
a table:

1. Teacher scoring (`rollcall score --teacher embedded`): the teacher
   logprobs of calls the proxy recorded from the embedded model, in prompt +
   completion tokens read per second, at 1 and 4 requests at once; beside
   what a researcher would write instead, a transformers forward pass over
   the same ids (float32 on the CPU, one call at a time), on the same cores.
2. Judge throughput (`rollcall judge`) against the scripted model server as
   the judge, in trajectories per second at 1, 4 and 16 requests at once:
   with an instant judge (rollcall's own cost: reading, rendering,
   parsing, revisions) and with a judge that takes 50 ms per answer.

    .venv/bin/python benches/recipes.py [--bin target/release/rollcall]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import rollcall_harness as h  # noqa: E402

EMBEDDED_TOML = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "smol"
kind = "embedded"
[routes.embedded]
model_file = "{model}"
default_max_tokens = 64
default_temperature = 0.7
"""

QUESTIONS = [
    "Explain what a race condition is.", "How does a hash map handle collisions?",
    "What does `git rebase` do?", "Why do tests sometimes pass locally and fail in CI?",
    "What is a unified diff?", "How does Python's garbage collector work?",
    "What is the difference between a process and a thread?", "What does a linker do?",
]


def cli(*args: str) -> dict:
    p = subprocess.run([h.rollcall_bin(), *args, "--json"], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"rollcall {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def teacher_scoring(work: Path) -> list[tuple[str, str]]:
    gguf = h.model_file()
    p = h.start_proxy(work / "teacher", "unused", toml=EMBEDDED_TOML.format(model=gguf))
    try:
        for i, q in enumerate(QUESTIONS):
            messages = [{"role": "user", "content": q}]
            for follow in ["Give an example.", None]:
                r = h.post_json(p.url, f"/rollouts/opd-{i}/v1/chat/completions",
                                {"model": "smol", "messages": messages, "seed": i}, timeout=600)
                assert r.status == 200, r.body
                if follow:
                    messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                                 {"role": "user", "content": follow}]
        h.wait_for_shards(p.url)
    finally:
        p.terminate()
    rows = []
    rates = {}
    for conc in [1, 4]:
        rep = cli("score", "--teacher", "embedded", "--model-file", str(gguf), "--shards", str(p.shards),
                  "--concurrency", str(conc), "--rescore")
        rates[conc] = rep["tokens_read"] / rep["seconds"]
        rows.append((f"score, embedded teacher, {conc} at once",
                     f"{rates[conc]:,.0f} tokens/s ({rep['scored']} calls, {rep['tokens_read']:,} tokens read, "
                     f"{rep['tokens_scored']:,} scored, {rep['seconds']:.1f} s)"))
    # What one would write instead: a transformers forward pass per call.
    import torch
    import transformers
    torch.set_num_threads(os.cpu_count() or 1)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    calls = h.read_calls_arrow(p.shards)
    tokens = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for c in calls:
            ids = c["prompt_token_ids"] + c["completion_token_ids"]
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
            n = len(c["prompt_token_ids"])
            _ = [lp[n - 1 + i][t].item() for i, t in enumerate(c["completion_token_ids"])]
            tokens += len(ids)
    hf = tokens / (time.perf_counter() - t0)
    rows.append(("transformers forward pass, float32", f"{hf:,.0f} tokens/s ({len(calls)} calls)"))
    rows.append(("ratio, rollcall (4 at once) / transformers", f"{rates[4] / hf:.2f}"))
    return rows


def judge_throughput(work: Path, n: int = 200) -> list[tuple[str, str]]:
    up = h.start_upstream(work / "judge-upstream")
    p = h.start_proxy(work / "judge", up.url)
    verdict = json.dumps({"reasoning": "ok", "scores": {f"R{i}": 0.5 for i in range(1, 8)}})
    meta = {"outcome": "completed", "harness_exit": 0, "resolved": False, "model_patch": "",
            "report": {"patch_successfully_applied": False, "resolved": False,
                       "report": {"FAIL_TO_PASS": {"success": [], "failure": ["t::test_a"]},
                                  "PASS_TO_PASS": {"success": [], "failure": []}}}}
    try:
        for i in range(n):
            text = f"Task {i}: fix the bug. [[answer: {verdict}]]"
            msgs = [{"role": "user", "content": text}, {"role": "assistant", "content": "```bash\npytest -q\n```"},
                    {"role": "user", "content": "<returncode>1</returncode>\n" + "FAILED t::test_a\n" * 40}]
            r = h.post_json(p.url, f"/rollouts/j{i:04d}/v1/chat/completions", {"model": "scripted", "messages": msgs})
            assert r.status == 200, r.body
            assert h.post_json(p.url, f"/v1/rollouts/j{i:04d}/finish",
                               {"status": "completed", "reward": 0.0, "metadata": {**meta, "task": f"t{i}"}}).status == 200
        h.wait_for_shards(p.url)
    finally:
        p.terminate()
    rows = []
    for latency in [0, 50]:
        model = "scripted" if latency == 0 else f"scripted@ttfb_ms={latency}"
        for conc in [1, 4, 16]:
            rep = cli("judge", "--judge", f"{up.url}/v1", "--model", model, "--shards", str(p.shards),
                      "--concurrency", str(conc))
            assert rep["judged"] == n and rep["errors"] == 0, rep
            rows.append((f"judge, {latency} ms judge, {conc} at once",
                         f"{rep['trajectories_per_s']:,.1f} trajectories/s ({n} in {rep['seconds']:.2f} s)"))
    up.kill()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "rollcall"))
    args = ap.parse_args()
    os.environ["ROLLCALL_BIN"] = str(Path(args.bin).resolve())
    with tempfile.TemporaryDirectory(prefix="rollcall-recipes-") as d:
        work = Path(d)
        rows = teacher_scoring(work) + judge_throughput(work)
    width = max(len(r[0]) for r in rows)
    print("\nrecipes (benches/recipes.py)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
