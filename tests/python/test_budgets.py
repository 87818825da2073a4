"""Per-rollout budgets: max calls, max total tokens and max prompt tokens,
from `[rollouts.budget]`, `PUT /v1/rollouts/<id>/budget`, the
`x-rollcall-budget` header and `rollcall run --max-calls`. A call past one
is refused in the harness's own API format (the real `openai` and
`anthropic` SDKs raise their own errors), a prompt past its limit gets the
API's context-length error, and every refusal is a `budget_exceeded` row.

The upstream is the scripted model server: its prompt token count is the
number of whitespace-separated words of the request body."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

import rollcall_harness as h
import test_harnesses as th


def failures(proxy) -> dict[str, list[tuple]]:
    h.wait_for_shards(proxy.url)
    rows = h.duck_dicts(proxy.shards, "SELECT rollout_id, sequence, status, http_status, failure_class, "
                                      "attempt FROM t ORDER BY rollout_id, sequence")
    by: dict[str, list[tuple]] = {}
    for r in rows:
        by.setdefault(r["rollout_id"], []).append((r["status"], r["http_status"], r["failure_class"], r["attempt"]))
    return by


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


BUDGETED = h.DEFAULT_TOML + """
[rollouts.budget]
max_calls = 2
"""


def test_max_calls_in_each_api_and_retries_are_not_calls(make_proxy):
    proxy = make_proxy(BUDGETED)
    oa = openai.OpenAI(base_url=f"{proxy.url}/rollouts/oa/v1", api_key="x", max_retries=2)
    # The first call fails once and the SDK retries it: one call, not two.
    oa.chat.completions.create(model="m@fault=500@fault_times=1", messages=user("one"))
    oa.chat.completions.create(model="m", messages=user("two"))
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="m", messages=user("three"))
    assert e.value.status_code == 400 and e.value.code == "budget_exceeded", e.value.body
    assert "made 2 calls" in e.value.message

    an = anthropic.Anthropic(base_url=f"{proxy.url}/rollouts/an", api_key="x", max_retries=0)
    for text in ("one", "two"):
        an.messages.create(model="claude-x", max_tokens=16, messages=user(text))
    with pytest.raises(anthropic.BadRequestError) as e:
        an.messages.create(model="claude-x", max_tokens=16, messages=user("three"))
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "budget exceeded" in e.value.body["error"]["message"]

    # The standing says what was spent; a finish forgets it.
    st = h.raw_request(proxy.url, "GET", "/v1/rollouts/oa/budget")
    assert st.status == 200 and json.loads(st.body)["calls"] == 2, st.body
    by = failures(proxy)
    assert by["oa"] == [("failed", 500, "upstream_server_error", 0), ("ok", 200, None, 1),
                        ("ok", 200, None, 0), ("failed", 400, "budget_exceeded", 0)], by["oa"]
    assert by["an"][-1] == ("failed", 400, "budget_exceeded", 0)
    assert h.post_json(proxy.url, "/v1/rollouts/oa/finish", {"status": "done"}).status == 200
    oa.chat.completions.create(model="m", messages=user("after the finish, a fresh budget"))


def test_max_prompt_tokens_is_the_apis_context_length_error(proxy):
    r = h.raw_request(proxy.url, "PUT", "/v1/rollouts/p/budget", body=json.dumps({"max_prompt_tokens": 600}).encode(),
                      headers={"content-type": "application/json"})
    assert r.status == 200, r.body
    assert json.loads(r.body)["budget"]["max_prompt_tokens"] == 600
    oa = openai.OpenAI(base_url=f"{proxy.url}/rollouts/p/v1", api_key="x", max_retries=0)
    words = lambda n: " ".join(["w"] * n)  # noqa: E731
    # 200 words: the upstream counts ~200 prompt tokens, and the rollout
    # learns its bytes per token from that answer.
    oa.chat.completions.create(model="m", messages=user(words(200)))
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="m", messages=user(words(1000)))
    assert e.value.code == "context_length_exceeded", e.value.body
    assert "maximum context length is 600 tokens" in e.value.message
    # The harness compacts: a short prompt goes through again.
    oa.chat.completions.create(model="m", messages=user(words(100)))
    # Responses and Messages get their own APIs' words for it.
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model="m", input=words(1000), stream=True)
    assert e.value.code == "context_length_exceeded" and "context window" in e.value.message
    an = anthropic.Anthropic(base_url=f"{proxy.url}/rollouts/p", api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        an.messages.create(model="claude-x", max_tokens=16, messages=user(words(1000)))
    assert e.value.body["error"]["message"].startswith("prompt is too long: "), e.value.body
    assert "tokens > 600 maximum" in e.value.body["error"]["message"]
    by = failures(proxy)
    assert [x[2] for x in by["p"]] == [None, "budget_exceeded", None, "budget_exceeded", "budget_exceeded"]


def test_max_total_tokens_from_a_header_counts_streamed_usage(proxy):
    oa = openai.OpenAI(base_url=f"{proxy.url}/rollouts/t/v1", api_key="x", max_retries=0,
                       default_headers={"x-rollcall-budget": "max_total_tokens=30"})
    stream = oa.chat.completions.create(model="m", messages=user("a b c d e f g h i j"), stream=True,
                                        stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage][0]
    assert usage.total_tokens >= 30, usage
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="m", messages=user("again"))
    assert e.value.code == "budget_exceeded" and "max_total_tokens" in e.value.message
    st = json.loads(h.raw_request(proxy.url, "GET", "/v1/rollouts/t/budget").body)
    assert st["total_tokens"] == usage.total_tokens and st["budget"]["max_total_tokens"] == 30, st
    # A header that cannot be read is the harness's 400, not a silent default.
    bad = h.post_json(proxy.url, "/rollouts/t2/v1/chat/completions", {"model": "m", "messages": user("x")},
                      headers={"x-rollcall-budget": "max_calls=many"})
    assert bad.status == 400 and json.loads(bad.body)["error"]["code"] == "invalid_budget", bad.body
    by = failures(proxy)
    assert by["t"][-1][2] == "budget_exceeded" and by["t2"] == [("failed", 400, "bad_request", 0)]


@pytest.mark.parametrize("name", ["codex", "claude-code"])
def test_rollcall_run_max_calls_stops_a_real_harness_in_its_own_format(name, proxy, tmp_path):
    """`rollcall run --max-calls 1`: the harness's first call (its tool call)
    is answered, its second gets the budget error in its API's format, which
    the harness reports; the rollout is finished as failed."""
    th.need(name)
    rollout = f"budget-{name}"
    p = th.start_run(proxy, name, rollout, tmp_path / "work", timeout=300, extra=["--max-calls", "1"])
    rc, out = th.finish_run(p)
    assert rc not in (0, 124), out[-3000:]
    assert "budget exceeded" in out, out[-3000:]
    calls, fins = th.shards_of(proxy)
    rows = calls[rollout]
    assert rows[0]["status"] == "ok", rows[0]
    refused = [r for r in rows if r["failure_class"] == "budget_exceeded"]
    assert refused and all(r["http_status"] == 400 for r in refused), rows
    assert all(r["failure_class"] in (None, "budget_exceeded") for r in rows), rows
    assert fins[rollout][0]["status"] == "failed"
