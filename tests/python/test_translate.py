"""Anthropic Messages and dialect translation, driven by the official
`openai` and `anthropic` SDKs through a real proxy, in front of the scripted
upstream (a real HTTP server standing in for a model server). Shards are
read back with pyarrow.

Routes of kind "chat" make the proxy speak only Chat Completions upstream:
Responses and Messages calls are translated there and back.
"""

from __future__ import annotations

import json

import anthropic
import pytest

import rollcall_harness as h

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_RESPONSES = {"type": "function", "name": "get_weather", "description": "Weather for a city",
                     "parameters": WEATHER["input_schema"]}


def chat_route(upstream: str, extra: str = "") -> str:
    return f"""
[shards]
max_age_secs = 0.2
[[routes]]
name = "chatonly"
url = "{upstream}/v1"
kind = "chat"
{extra}
"""


def anthropic_route(upstream: str) -> str:
    return f"""
[shards]
max_age_secs = 0.2
[[routes]]
name = "claude"
url = "{upstream}/v1"
kind = "anthropic"
"""


def claude(base: str, rollout: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{base}/rollouts/{rollout}", api_key="sk-test", max_retries=0)


def rows_of(proxy: h.Proxy, rollout: str) -> list[dict]:
    h.wait_for_shards(proxy.url)
    return h.rows_by_rollout(h.read_calls_arrow(proxy.shards)).get(rollout, [])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_messages_translated_to_chat_two_turns(stream, make_proxy, upstream):
    proxy = make_proxy(toml=chat_route(upstream))
    c = claude(proxy.url, f"msg-chat-{stream}")
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    kw = dict(model="scripted@events=3", max_tokens=256, system="be brief", tools=[WEATHER], messages=msgs)
    if stream:
        with c.messages.stream(**kw) as s:
            first = s.get_final_message()
    else:
        first = c.messages.create(**kw)
    assert first.stop_reason == "tool_use"
    tu = [b for b in first.content if b.type == "tool_use"]
    assert len(tu) == 1 and tu[0].name == "get_weather" and tu[0].input == {"city": "scripted"}
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0].id, "content": "sunny"}]}]
    kw["messages"] = msgs
    if stream:
        with c.messages.stream(**kw) as s:
            text = "".join(s.text_stream)
            second = s.get_final_message()
        assert text == second.content[0].text
    else:
        second = c.messages.create(**kw)
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "Done. Reply to: weather in Paris?"
    assert second.usage.output_tokens > 0

    rows = rows_of(proxy, f"msg-chat-{stream}")
    assert [r["wire_api"] for r in rows] == ["messages", "messages"]
    assert [r["upstream_api"] for r in rows] == ["chat_completions"] * 2
    up = json.loads(rows[1]["upstream_request"])
    assert up["messages"][0] == {"role": "system", "content": "be brief"}
    assert up["messages"][-1] == {"role": "tool", "tool_call_id": tu[0].id, "content": "sunny"}
    assert up["tools"][0]["function"]["name"] == "get_weather"
    assert json.loads(rows[0]["tool_calls"])[0]["function"]["name"] == "get_weather"
    assert json.loads(rows[1]["response_message"])["content"] == "Done. Reply to: weather in Paris?"
    # The harness's bytes and the upstream's are both kept.
    if stream:
        assert b"event: message_stop" in rows[1]["response_raw"]
        assert b"data: [DONE]" in rows[1]["upstream_response_raw"]
    else:
        assert json.loads(rows[1]["response_raw"])["type"] == "message"
        assert json.loads(rows[1]["upstream_response_raw"])["object"] == "chat.completion"
    assert all(r["status"] == "ok" for r in rows)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_translated_to_chat_two_turns(stream, make_proxy, upstream):
    proxy = make_proxy(toml=chat_route(upstream))
    rollout = f"resp-chat-{stream}"
    client = h.sdk_client(f"{proxy.url}/rollouts/{rollout}/v1")
    items = [{"role": "user", "content": "weather in Oslo?"}]

    def call(inp):
        if not stream:
            return client.responses.create(model="scripted@events=3", instructions="be brief", input=inp,
                                           tools=[WEATHER_RESPONSES])
        done = None
        for ev in client.responses.create(model="scripted@events=3", instructions="be brief", input=inp,
                                          tools=[WEATHER_RESPONSES], stream=True):
            if ev.type == "response.completed":
                done = ev.response
        return done

    r1 = call(items)
    fc = [o for o in r1.output if o.type == "function_call"]
    assert len(fc) == 1 and fc[0].name == "get_weather" and json.loads(fc[0].arguments) == {"city": "scripted"}
    items += [fc[0].model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": fc[0].call_id, "output": [{"type": "input_text", "text": "cold"}]}]
    r2 = call(items)
    assert r2.output_text == "Done. Reply to: weather in Oslo?"
    assert r2.usage.input_tokens > 0

    rows = rows_of(proxy, rollout)
    assert [r["upstream_api"] for r in rows] == ["chat_completions"] * 2
    up = json.loads(rows[1]["upstream_request"])
    assert up["messages"][0] == {"role": "system", "content": "be brief"}
    # Kimi-style list outputs arrive as their text.
    assert up["messages"][-1] == {"role": "tool", "tool_call_id": fc[0].call_id, "content": "cold"}
    if stream:
        assert up["stream_options"] == {"include_usage": True}
        assert b"event: response.completed" in rows[1]["response_raw"]


def test_translation_errors_come_back_in_the_harness_format(make_proxy, upstream):
    proxy = make_proxy(toml=chat_route(upstream))
    c = claude(proxy.url, "msg-err")
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="scripted@fault=400", max_tokens=64, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "scripted bad request" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.InternalServerError):
        c.messages.create(model="scripted@fault=500", max_tokens=64, messages=[{"role": "user", "content": "x"}])
    # An error event midway through a translated stream reaches the SDK.
    with pytest.raises(anthropic.APIStatusError) as e:
        with c.messages.stream(model="scripted@fault=stream_error", max_tokens=64,
                               messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()
    assert "scripted stream error" in str(e.value)
    rows = rows_of(proxy, "msg-err")
    assert [r["failure_class"] for r in rows] == ["upstream_client_error", "upstream_server_error", "upstream_stream_error"]


def test_unsupported_constructs_are_dropped_or_rejected(make_proxy, upstream):
    drop = make_proxy(toml=chat_route(upstream), name="drop")
    client = h.sdk_client(f"{drop.url}/rollouts/drop/v1")
    r = client.responses.create(model="scripted", input="hi", tools=[WEATHER_RESPONSES, {"type": "web_search"}])
    assert r.output[0].type == "function_call"
    assert "web_search tool" in drop.stderr_text()
    up = json.loads(rows_of(drop, "drop")[0]["upstream_request"])
    assert [t["function"]["name"] for t in up["tools"]] == ["get_weather"]

    reject = make_proxy(toml=chat_route(upstream, 'unsupported = "reject"'), name="reject")
    body = {"model": "scripted", "input": "hi", "tools": [{"type": "web_search"}]}
    resp = h.post_json(reject.url, "/rollouts/rej/v1/responses", body)
    assert resp.status == 400
    assert "web_search tool" in resp.json()["error"]["message"] and resp.json()["error"]["code"] == "untranslatable"
    assert rows_of(reject, "rej")[0]["failure_class"] == "bad_request"


def test_a_call_the_route_cannot_take_is_refused_clearly(make_proxy, upstream):
    proxy = make_proxy(toml=anthropic_route(upstream))
    resp = h.post_json(proxy.url, "/rollouts/x/v1/chat/completions",
                       {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "unsupported_api"
    assert "serves messages" in resp.json()["error"]["message"]


def vllm_route(upstream: str) -> str:
    return f"""
[shards]
max_age_secs = 0.2
[[routes]]
name = "vllm"
url = "{upstream}/v1"
kind = "vllm"
"""


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_vllm_route_captures_tokens_the_harness_did_not_ask_for(stream, make_proxy, upstream):
    """The scripted upstream answers `return_token_ids` and `logprobs` in
    vLLM's documented shapes (token ids are byte values of the text)."""
    proxy = make_proxy(toml=vllm_route(upstream))
    rollout = f"tok-{stream}"
    client = h.sdk_client(f"{proxy.url}/rollouts/{rollout}/v1")
    msgs = [{"role": "user", "content": "tokens please"}]
    if stream:
        chunks = list(client.chat.completions.create(model="scripted@events=3", messages=msgs, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        extra = [c.model_extra for c in chunks] + [c.choices[0].model_extra for c in chunks if c.choices]
        lps = [c.choices[0].logprobs for c in chunks if c.choices]
    else:
        r = client.chat.completions.create(model="scripted", messages=msgs)
        text = r.choices[0].message.content
        extra = [r.model_extra, r.choices[0].model_extra]
        lps = [r.choices[0].logprobs]
    assert text == "Reply to: tokens please"
    # The harness sees no token data it did not ask for.
    assert all(e.get("token_ids") is None and e.get("prompt_token_ids") is None for e in extra)
    assert all(lp is None for lp in lps)
    row = rows_of(proxy, rollout)[0]
    up = json.loads(row["upstream_request"])
    assert up["return_token_ids"] is True and up["logprobs"] is True
    assert "return_token_ids" not in json.loads(row["request"])
    assert row["token_capture"] == "ids_and_logprobs"
    assert list(row["completion_token_ids"]) == list(text.encode())
    assert list(row["prompt_token_ids"]) == list(b"<|user|>tokens please<|end|><|assistant|>")
    assert len(row["completion_logprobs"]) == len(text.encode())
    assert b"token_ids\":[" not in row["response_raw"] and b"token_ids\":[" in row["upstream_response_raw"]


def test_vllm_route_keeps_what_the_harness_asked_for(make_proxy, upstream):
    proxy = make_proxy(toml=vllm_route(upstream))
    client = h.sdk_client(f"{proxy.url}/rollouts/asked/v1")
    r = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "lp"}], logprobs=True)
    assert len(r.choices[0].logprobs.content) == len("Reply to: lp")
    assert r.choices[0].model_extra.get("token_ids") is None


def test_translated_call_on_vllm_route_records_tokens(make_proxy, upstream):
    """A Messages call translated to Chat Completions on a vLLM route: the
    ids and logprobs come from the upstream's chat answer."""
    proxy = make_proxy(toml=vllm_route(upstream))
    c = claude(proxy.url, "tok-msg")
    with c.messages.stream(model="scripted", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
    assert text == "Reply to: hi"
    row = rows_of(proxy, "tok-msg")[0]
    assert row["upstream_api"] == "chat_completions"
    assert row["token_capture"] == "ids_and_logprobs"
    assert bytes(row["completion_token_ids"]) == text.encode()
