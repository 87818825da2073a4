"""The `learn` task family's generator (fixtures/tasks/learn/generate): a
seed gives the same split every time and another seed a fresh one; no
held-out task is a training task; the teacher's file holds training tasks
only; and in the built images the hidden tests fail at the base commit and
pass with the gold patch, graded by `rollcall grade` (SWE-bench's way)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import rollcall_harness as h

GENERATE = h.REPO_ROOT / "fixtures" / "tasks" / "learn" / "generate"


def generate(out: Path, seed: int, train: int, heldout: int, images: bool = False) -> dict[str, list[dict]]:
    args = [sys.executable, str(GENERATE), "--seed", str(seed), "--out", str(out), "--train", str(train),
            "--heldout", str(heldout)]
    r = subprocess.run(args + ([] if images else ["--no-images"]), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
            for name in ("train", "heldout")}


def test_a_seed_makes_one_split_and_another_seed_a_fresh_one(tmp_path):
    a = generate(tmp_path / "a", 5, 40, 10)
    b = generate(tmp_path / "b", 5, 40, 10)
    c = generate(tmp_path / "c", 6, 40, 10)
    assert a == b
    assert (tmp_path / "a" / "gold.json").read_text() == (tmp_path / "b" / "gold.json").read_text()
    statements = {t["problem_statement"] for t in a["train"] + a["heldout"]}
    assert len(statements & {t["problem_statement"] for t in c["train"] + c["heldout"]}) < 5

    train, held = a["train"], a["heldout"]
    assert (len(train), len(held)) == (40, 10)
    assert all("-train-" in t["instance_id"] for t in train)
    assert all("-heldout-" in t["instance_id"] for t in held)
    # A held-out task is never a training task: not its issue, not its fix.
    assert not {t["problem_statement"] for t in held} & {t["problem_statement"] for t in train}
    assert not {t["patch"] for t in held} & {t["patch"] for t in train}
    assert len({t["kind"] for t in train}) == 4
    # The teacher knows the training tasks' commands and nothing else.
    gold = json.loads((tmp_path / "a" / "gold.json").read_text())
    assert set(gold) == {t["instance_id"] for t in train}
    assert all(1 <= len(g["commands"]) <= 3 for g in gold.values())
    for t in train + held:
        assert t["FAIL_TO_PASS"] and len(t["PASS_TO_PASS"]) == 4
        assert not set(t["FAIL_TO_PASS"]) & set(t["PASS_TO_PASS"])
        assert t["image"].startswith("rollcall-tasks/learn-s5:")
        assert t["patch"].startswith("diff --git") and t["test_patch"].startswith("diff --git a/tests/test_task.py")


def grade(tmp_path: Path, task: dict, patch: str | None) -> dict:
    """SWE-bench's way, with rollcall's scripts: a fresh container of the
    task's image, `patch` applied (none: the base commit), the eval script
    run, its log graded by `rollcall grade`."""
    inst = tmp_path / f"{task['instance_id']}.json"
    inst.write_text(json.dumps(task))

    def script(kind: str) -> str:
        r = subprocess.run([h.rollcall_bin(), "grade", "--instance", str(inst), "--print", kind],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    cid = subprocess.run(["docker", "run", "-d", "--network", "none", task["image"]], capture_output=True,
                         text=True, check=True).stdout.strip()
    try:
        log = ""
        if patch is not None:
            pf = tmp_path / f"{task['instance_id']}.patch"
            pf.write_text(patch)
            subprocess.run(["docker", "cp", str(pf), f"{cid}:/tmp/patch.diff"], check=True, capture_output=True)
            r = subprocess.run(["docker", "exec", "-i", cid, "bash", "-s"], input=script("apply"),
                               capture_output=True, text=True, timeout=120)
            log += r.stdout + r.stderr
        r = subprocess.run(["docker", "exec", "-i", cid, "bash", "-s"], input=script("eval"), capture_output=True,
                           text=True, timeout=300)
        log += r.stdout + r.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    lf = tmp_path / f"{task['instance_id']}.log"
    lf.write_text(log)
    rep = subprocess.run([h.rollcall_bin(), "grade", "--instance", str(inst), "--log", str(lf)],
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    return json.loads(rep.stdout)


def test_in_the_images_the_hidden_tests_fail_before_and_pass_after_the_gold_patch(tmp_path):
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker daemon answers: run .ci/docker-up (make test does)")
    split = generate(tmp_path / "tasks", 9, 3, 1, images=True)
    for task in split["train"] + split["heldout"]:
        assert grade(tmp_path, task, None)["resolved"] is False, task["instance_id"]
        assert grade(tmp_path, task, task["patch"])["resolved"] is True, task["instance_id"]
