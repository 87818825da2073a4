"""Claude Code's side calls are marked `side_call`.

Claude Code 2.1's one-shot helpers (the session's title, a label for a
turn's tool calls) are sent with no tools, its own header blocks first and
then the helper's system prompt. Headless runs (`claude -p`, as the adapter
runs it) make none of them against our upstream, so this test checks the
rules two ways instead:
- every `[[side_calls]]` prefix of the adapter occurs in the pinned Claude
  Code executable (a new release that rewords a prompt fails here);
- a helper call built as Claude Code builds one (the header blocks of a
  real captured call, `fixtures/claude-code/exchange.jsonl`, then the
  prompt text read from the executable) is recorded `side_call`, while the
  captured trajectory calls are not.
"""

from __future__ import annotations

import json
import re
import tomllib

import anthropic

import rollcall_harness as h
import test_harnesses as th

ADAPTER = h.REPO_ROOT / "harness-adapters" / "claude-code" / "adapter.toml"
EXE = "node_modules/@anthropic-ai/claude-code-linux-x64/claude"


def prompt_in_executable(data: bytes, prefix: str) -> str:
    """The whole prompt starting with `prefix`, as the executable holds it
    (a JavaScript template literal, up to its closing backtick)."""
    i = data.find(prefix.encode())
    assert i >= 0, f"{prefix!r} is not in the pinned Claude Code: update harness-adapters/claude-code/adapter.toml"
    end = data.find(b"`", i)
    text = data[i:end].decode("utf-8", "replace")
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)


def test_claude_code_helper_calls_are_side_calls(proxy):
    th.need("claude-code")
    rules = tomllib.loads(ADAPTER.read_text())["side_calls"]
    assert len(rules) >= 2 and all(r["tools"] is False for r in rules)
    data = (th.HARNESS_DIR / "claude-code" / EXE).read_bytes()
    captured = [json.loads(line) for line in (h.REPO_ROOT / "fixtures" / "claude-code" / "exchange.jsonl").open()]
    first = json.loads(captured[0]["request"])
    headers = [b for b in first["system"] if b["text"].startswith(("x-anthropic-billing-header", "You are a Claude agent"))]
    assert len(headers) == 2, first["system"][:2]

    an = anthropic.Anthropic(base_url=f"{proxy.url}/rollouts/cc", api_key="x", max_retries=0)
    for r in rules:
        system = headers + [{"type": "text", "text": prompt_in_executable(data, r["system_prefix"])}]
        an.messages.create(model="claude-scripted", max_tokens=64, system=system, tools=[],
                           messages=[{"role": "user", "content": "<session>\nFix the failing test\n</session>"}])
    # The captured trajectory calls, sent again as they were: not side calls.
    for c in captured:
        req = json.loads(c["request"])
        req["stream"] = False
        r = h.post_json(proxy.url, "/rollouts/cc/v1/messages?beta=true", req)
        assert r.status == 200, r.body
    h.wait_for_shards(proxy.url)
    rows = h.duck_dicts(proxy.shards, "SELECT sequence, side_call FROM t WHERE rollout_id = 'cc' ORDER BY sequence")
    assert [r["side_call"] for r in rows] == [True] * len(rules) + [False] * len(captured), rows
