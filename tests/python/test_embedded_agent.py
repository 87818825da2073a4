"""A real harness runs a command the shipped model asked for.

mini-swe-agent (tool-calling mode, unchanged) drives the embedded model
through the proxy under `rollcall run`. The prompt and the sampling (greedy)
are ones for which SmolLM2-135M answers with a Hermes `<tool_call>` block:
the route turns it into an OpenAI tool call, mini-swe-agent executes it in
the rollout's working directory, and the command's output goes back to the
model in the next call. The rows record the tool call, token-exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import rollcall_harness as h

HARNESS_DIR = Path(os.environ.get("ROLLCALL_HARNESS_DIR", h.REPO_ROOT / ".harnesses"))

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo rollcall-42 > proof.txt"}}\n</tool_call>'
# Found by sampling the shipped model over prompts and seeds: asked to
# copy a call, greedy decoding copies it.
TASK = "Reply with exactly this and nothing else:\n" + TOOL_CALL

TOML = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "smol"
kind = "embedded"
[routes.embedded]
model_file = "{model}"
default_max_tokens = 60
"""


def test_mini_swe_agent_executes_a_tool_call_of_the_embedded_model(tmp_path, gguf):
    if not (HARNESS_DIR / "mini-swe-agent" / ".rollcall-installed").exists():
        pytest.fail(f"mini-swe-agent is not installed in {HARNESS_DIR}: run "
                    f"`rollcall harness install mini-swe-agent --prefix {HARNESS_DIR}`")
    p = h.start_proxy(tmp_path, "unused", toml=TOML.format(model=gguf))
    work = tmp_path / "work"
    work.mkdir()
    overrides = ["agent.step_limit=2", "agent.system_template=You are a helpful assistant that can interact with a computer.",
                 "agent.instance_template={{task}}", "model.model_kwargs.temperature=0", "model.model_kwargs.seed=0"]
    args = [h.rollcall_bin(), "run", "--harness", "mini-swe-agent", "--rollout", "tool-1", "--model", "smol",
            "--workdir", str(work), "--proxy", p.url, "--prefix", str(HARNESS_DIR), "--timeout", "600",
            "--check", "test \"$(cat proof.txt)\" = rollcall-42"]
    for o in overrides:
        args += ["--harness-arg=-c", f"--harness-arg={o}"]
    try:
        r = subprocess.run([*args, "--", TASK], capture_output=True, text=True, timeout=900)
        assert (work / "proof.txt").read_text() == "rollcall-42\n", r.stdout[-3000:] + r.stderr[-3000:]
        h.wait_for_shards(p.url)
    finally:
        p.terminate()
    calls = sorted(h.read_calls_arrow(p.shards), key=lambda c: c["sequence"])
    assert len(calls) == 2, [c["response_message"] for c in calls]
    first = json.loads(calls[0]["response_message"])
    (call,) = first["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "echo rollcall-42 > proof.txt"}
    assert calls[0]["finish_reason"] == "tool_calls"
    # The model's own tokens are the Hermes block.
    assert calls[0]["completion_token_ids"] and len(calls[0]["completion_token_ids"]) == len(calls[0]["completion_logprobs"])
    # mini-swe-agent sent the command's result back with the call's id.
    results = [m for m in json.loads(calls[1]["messages"]) if m.get("role") == "tool"]
    assert results and results[0]["tool_call_id"] == call["id"]
    assert json.loads(results[0]["content"])["returncode"] == 0
    (rollout,) = h.read_rollouts_arrow(p.shards)
    assert rollout["reward"] == 1.0  # `--check` passed: the file is there
