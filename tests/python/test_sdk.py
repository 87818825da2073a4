"""The official `openai` SDK through rollcall, against the scripted upstream;
then the shards read back with pyarrow and DuckDB and compared with what the
SDK sent and received, byte for byte."""

from __future__ import annotations

import json

import rollcall_harness as h

WEATHER_TOOL_CHAT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
WEATHER_TOOL_RESPONSES = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": WEATHER_TOOL_CHAT["function"]["parameters"],
}
# The scripted model fills only required arguments.
EXPECTED_ARGS = {"city": "scripted"}

WIRE_API = {
    "/chat/completions": "chat_completions",
    "/responses": "responses",
    "/completions": "completions",
}


def read_both(shards) -> list[dict]:
    """Read the calls shards with pyarrow and with DuckDB; check that both
    readers see the same rows; return pyarrow's."""
    rows = h.read_calls_arrow(shards)
    d = h.duck_dicts(
        shards,
        "SELECT call_id, rollout_id, sequence, wire_api, stream, status, http_status, request, "
        "response, response_raw, messages, tool_calls, finish_reason, total_tokens FROM t",
    )
    assert len(rows) == len(d)
    by_id = {r["call_id"]: r for r in rows}
    assert len(by_id) == len(rows), "duplicate call_id"
    for dr in d:
        ar = by_id[dr["call_id"]]
        for k, v in dr.items():
            assert ar[k] == v, (k, ar[k], v)
    return rows


def rollout_rows(rows: list[dict], rollout: str) -> list[dict]:
    out = sorted((r for r in rows if r["rollout_id"] == rollout), key=lambda r: r["sequence"])
    assert [r["sequence"] for r in out] == list(range(len(out))), "sequence must be 0..n-1"
    return out


def check_against_tee(rows: list[dict], exchanges: list[dict], rollout: str) -> None:
    """Each row matches the SDK exchange made in the same position: rollout,
    wire API, stream flag, status, request bytes, response bytes."""
    assert len(rows) == len(exchanges), (len(rows), [e["url"] for e in exchanges])
    for i, (row, ex) in enumerate(zip(rows, exchanges)):
        sent = json.loads(ex["request"])
        if not sent.get("stream"):
            # (the SDK stops reading a stream at its terminal event)
            assert ex["complete"], "the SDK did not read the whole response"
        endpoint = ex["url"].split("/v1", 1)[1]
        assert row["rollout_id"] == rollout
        assert row["sequence"] == i
        assert row["wire_api"] == WIRE_API[endpoint]
        assert row["stream"] is bool(sent.get("stream", False))
        assert row["status"] == "ok", row["failure_message"]
        assert row["http_status"] == ex["status"] == 200
        assert row["failure_class"] is None
        # the request exactly as the SDK sent it, and the response exactly as it got it
        assert row["request"].encode("utf-8") == ex["request"]
        assert row["response_raw"] == bytes(ex["response"])
        assert row["model"] == sent["model"]
        assert row["user_agent"] == ex["headers"].get("user-agent")
        assert row["route"] == "default"
        assert row["token_capture"] in ("none", "logprobs", "ids", "ids_and_logprobs")
        assert row["received_at"] <= row["first_byte_at"] <= row["done_at"]
        if not row["stream"]:
            # a whole body: the assembled response is that body
            assert json.loads(row["response"]) == json.loads(ex["response"])


def check_usage(row: dict, prompt: int, completion: int, total: int) -> None:
    assert (row["prompt_tokens"], row["completion_tokens"], row["total_tokens"]) == (prompt, completion, total)
    assert row["cached_tokens"] == 0 and row["reasoning_tokens"] == 0


# ------------------------------------------------------------------ chat


def test_chat_non_streaming_and_streaming(proxy):
    rid = "sdk-chat-1"
    tee = h.TeeTransport()
    client = h.sdk_client(f"{proxy.url}/rollouts/{rid}/v1", tee=tee)

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    c1 = client.chat.completions.create(model="scripted", messages=msgs, temperature=0.5, max_tokens=64)
    assert c1.choices[0].message.content == "Reply to: hello there"
    assert c1.choices[0].finish_reason == "stop"

    stream = client.chat.completions.create(
        model="scripted@events=5",
        messages=[{"role": "user", "content": "stream ünïcode ☕ please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, ids = "", None, None, set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == "Reply to: stream ünïcode ☕ please"
    assert finish == "stop"
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    # logprobs and vLLM-style token ids
    c3 = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "ids"}],
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    c3_text = c3.choices[0].message.content
    assert c3_text == "Reply to: ids"
    sdk_lp = [t.logprob for t in c3.choices[0].logprobs.content]

    h.wait_for_shards(proxy.url)
    rows = rollout_rows(read_both(proxy.shards), rid)
    check_against_tee(rows, tee.exchanges, rid)
    r1, r2, r3 = rows

    # non-streaming
    assert json.loads(r1["request"]) == {"model": "scripted", "messages": msgs, "temperature": 0.5, "max_tokens": 64}
    assert json.loads(r1["messages"]) == msgs
    assert r1["tools"] is None and r1["tool_calls"] is None
    assert json.loads(r1["response_message"]) == {"role": "assistant", "content": "Reply to: hello there"}
    assert r1["finish_reason"] == "stop"
    check_usage(r1, c1.usage.prompt_tokens, c1.usage.completion_tokens, c1.usage.total_tokens)
    assert r1["token_capture"] == "none"

    # streaming: one chat.completion assembled from the chunks
    assert r2["stream"] is True
    assert json.loads(r2["request"])["stream_options"] == {"include_usage": True}
    assert r2["response_raw"].endswith(b"data: [DONE]\n\n")
    assembled = json.loads(r2["response"])
    assert assembled["object"] == "chat.completion"
    assert assembled["id"] in ids
    assert assembled["choices"][0]["message"]["content"] == text
    assert assembled["choices"][0]["finish_reason"] == "stop"
    assert assembled["usage"]["total_tokens"] == usage.total_tokens
    assert json.loads(r2["response_message"])["content"] == text
    assert r2["finish_reason"] == "stop"
    check_usage(r2, usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)

    # token capture
    assert json.loads(r3["request"])["return_token_ids"] is True
    assert r3["token_capture"] == "ids_and_logprobs"
    assert r3["prompt_token_ids"] == list(b"<|user|>ids<|end|><|assistant|>")
    assert r3["completion_token_ids"] == list(c3_text.encode())
    assert r3["completion_logprobs"] == sdk_lp

    m = h.metrics_text(proxy.url)
    assert 'rollcall_calls_total{wire_api="chat_completions",status="ok"} 3' in m
    assert "rollcall_shard_lag_rows 0" in m


def test_chat_tools_two_turns(proxy):
    """Tool call, then a second turn with the tool result; once without and
    once with streaming."""
    rid = "sdk-chat-tools"
    tee = h.TeeTransport()
    client = h.sdk_client(f"{proxy.url}/rollouts/{rid}/v1", tee=tee)
    seen = []  # (tool_call as the SDK saw it, final text)

    for streaming in (False, True):
        q = f"weather in Paris? stream={streaming}"
        msgs = [{"role": "user", "content": q}]
        if not streaming:
            c = client.chat.completions.create(model="scripted", messages=msgs, tools=[WEATHER_TOOL_CHAT])
            assert c.choices[0].finish_reason == "tool_calls"
            assert c.choices[0].message.content is None
            content = c.choices[0].message.content
            tc = c.choices[0].message.tool_calls[0]
            call = {"id": tc.id, "type": "function",
                    "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
        else:
            call = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            finish, content = None, None
            for chunk in client.chat.completions.create(
                model="scripted@events=3", messages=msgs, tools=[WEATHER_TOOL_CHAT], stream=True
            ):
                for ch in chunk.choices:
                    finish = ch.finish_reason or finish
                    if ch.delta.content is not None:
                        content = (content or "") + ch.delta.content
                    for d in ch.delta.tool_calls or []:
                        call["id"] = d.id or call["id"]
                        if d.function:
                            call["function"]["name"] += d.function.name or ""
                            call["function"]["arguments"] += d.function.arguments or ""
            assert finish == "tool_calls"
        assert call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == EXPECTED_ARGS

        msgs2 = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21C"},
        ]
        if not streaming:
            c2 = client.chat.completions.create(model="scripted", messages=msgs2, tools=[WEATHER_TOOL_CHAT])
            final = c2.choices[0].message.content
        else:
            final = "".join(
                ch.delta.content or ""
                for chunk in client.chat.completions.create(
                    model="scripted", messages=msgs2, tools=[WEATHER_TOOL_CHAT], stream=True
                )
                for ch in chunk.choices
            )
        assert final == f"Done. Reply to: {q}"
        assert not content  # no text besides the tool call
        seen.append((call, content, final, msgs, msgs2))

    h.wait_for_shards(proxy.url)
    rows = rollout_rows(read_both(proxy.shards), rid)
    check_against_tee(rows, tee.exchanges, rid)
    assert len(rows) == 4
    for k, (call, content, final, msgs, msgs2) in enumerate(seen):
        first, second = rows[2 * k], rows[2 * k + 1]
        assert first["stream"] is second["stream"] is bool(k)
        # turn 1: the tool call, as the SDK saw it
        assert json.loads(first["tools"]) == [WEATHER_TOOL_CHAT]
        assert json.loads(first["messages"]) == msgs
        assert json.loads(first["tool_calls"]) == [call]
        rm = json.loads(first["response_message"])
        assert rm["tool_calls"] == [call] and rm["content"] == content
        assert first["finish_reason"] == "tool_calls"
        assert json.loads(first["response"])["choices"][0]["message"]["tool_calls"] == [call]
        # turn 2: the tool call and the tool result are in its messages
        m2 = json.loads(second["messages"])
        assert m2 == msgs2
        assert m2[1]["tool_calls"] == [call]
        assert m2[2] == {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21C"}
        assert json.loads(second["response_message"])["content"] == final
        assert second["tool_calls"] is None
        assert second["finish_reason"] == "stop"


# ------------------------------------------------------------- responses


def test_responses_text_and_function_tool(proxy):
    rid = "sdk-responses"
    tee = h.TeeTransport()
    client = h.sdk_client(f"{proxy.url}/rollouts/{rid}/v1", tee=tee)

    # 0: non-streaming text
    r0 = client.responses.create(model="scripted", input="plain question", instructions="be brief")
    assert r0.output_text == "Reply to: plain question"

    # 1: streaming text
    deltas, completed = [], None
    for ev in client.responses.create(model="scripted@events=6", input="streamed question", stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type == "response.completed":
            completed = ev.response
    assert "".join(deltas) == "Reply to: streamed question"
    assert completed is not None and completed.output_text == "Reply to: streamed question"

    # 2, 3: function tool turn, non-streaming; 4, 5: the same streaming
    finals = []
    for streaming in (False, True):
        q = f"what is the weather? stream={streaming}"
        items = [{"role": "user", "content": q}]
        if not streaming:
            resp = client.responses.create(model="scripted", input=items, tools=[WEATHER_TOOL_RESPONSES])
        else:
            resp = None
            for ev in client.responses.create(
                model="scripted@events=3", input=items, tools=[WEATHER_TOOL_RESPONSES], stream=True
            ):
                if ev.type == "response.completed":
                    resp = ev.response
        fc = [o for o in resp.output if o.type == "function_call"]
        assert len(fc) == 1 and fc[0].name == "get_weather"
        assert json.loads(fc[0].arguments) == EXPECTED_ARGS
        call_id = fc[0].call_id
        items2 = items + [
            {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": fc[0].arguments},
            {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
        ]
        if not streaming:
            final = client.responses.create(model="scripted", input=items2, tools=[WEATHER_TOOL_RESPONSES]).output_text
        else:
            final = "".join(
                ev.delta
                for ev in client.responses.create(
                    model="scripted", input=items2, tools=[WEATHER_TOOL_RESPONSES], stream=True
                )
                if ev.type == "response.output_text.delta"
            )
        assert final == f"Done. Reply to: {q}"
        finals.append((q, call_id, fc[0].arguments, final))

    h.wait_for_shards(proxy.url)
    rows = rollout_rows(read_both(proxy.shards), rid)
    check_against_tee(rows, tee.exchanges, rid)
    assert [r["stream"] for r in rows] == [False, True, False, False, True, True]
    assert all(r["wire_api"] == "responses" for r in rows)

    a, b = rows[0], rows[1]
    assert json.loads(a["messages"]) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "plain question"},
    ]
    assert json.loads(a["response_message"]) == {"role": "assistant", "content": r0.output_text}
    assert a["finish_reason"] == "stop"
    check_usage(a, r0.usage.input_tokens, r0.usage.output_tokens, r0.usage.total_tokens)

    assembled = json.loads(b["response"])
    assert assembled == completed.model_dump(mode="json", exclude_unset=True)
    assert assembled["status"] == "completed"
    assert json.loads(b["response_message"])["content"] == "Reply to: streamed question"
    assert b["finish_reason"] == "stop"
    check_usage(b, completed.usage.input_tokens, completed.usage.output_tokens, completed.usage.total_tokens)
    assert b"event: response.completed" in b["response_raw"]

    for k, (q, call_id, args, final) in enumerate(finals):
        first, second = rows[2 + 2 * k], rows[3 + 2 * k]
        call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}
        assert json.loads(first["tool_calls"]) == [call]
        assert json.loads(first["response_message"])["tool_calls"] == [call]
        assert first["finish_reason"] == "tool_calls"
        assert json.loads(first["tools"]) == [WEATHER_TOOL_CHAT]  # normalized to chat format
        m2 = json.loads(second["messages"])
        assert m2 == [
            {"role": "user", "content": q},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
        ]
        assert json.loads(second["response_message"])["content"] == final
        assert second["finish_reason"] == "stop"


# ----------------------------------------------------------- completions


def test_legacy_completions_and_models(proxy):
    rid = "sdk-completions"
    tee = h.TeeTransport()
    client = h.sdk_client(f"{proxy.url}/rollouts/{rid}/v1", tee=tee)

    c = client.completions.create(model="scripted", prompt="complete me", max_tokens=16)
    assert c.choices[0].text == "Reply to: complete me"
    text, usage = "", None
    for chunk in client.completions.create(model="scripted@events=4", prompt="stream me", stream=True):
        text += "".join(ch.text for ch in chunk.choices)
        usage = chunk.usage or usage
    assert text == "Reply to: stream me"

    models = client.models.list()
    assert "scripted" in [m.id for m in models.data]
    assert tee.exchanges[-1]["url"].endswith(f"/rollouts/{rid}/v1/models")
    calls = [e for e in tee.exchanges if not e["url"].endswith("/models")]

    h.wait_for_shards(proxy.url)
    rows = rollout_rows(read_both(proxy.shards), rid)
    check_against_tee(rows, calls, rid)
    a, b = rows
    assert a["wire_api"] == b["wire_api"] == "completions"
    assert json.loads(a["messages"]) == [{"role": "user", "content": "complete me"}]
    assert json.loads(a["response_message"]) == {"role": "assistant", "content": c.choices[0].text}
    assert a["finish_reason"] == "stop"
    check_usage(a, c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens)
    assembled = json.loads(b["response"])
    assert assembled["object"] == "text_completion"
    assert assembled["choices"][0]["text"] == text
    assert json.loads(b["response_message"])["content"] == text
    assert b["finish_reason"] == "stop"
    check_usage(b, usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


# ------------------------------------------------------- byte exactness


ODD_BODY = (
    '{ "model" :"scripted" ,\n'
    '\t"messages":[ {"role":"user","content":"caf\\u00e9 — naïve ☕ 😀 \\"quoted\\" \\n line"} ],\n'
    '  "temperature": 1.0e0, "vendor_ext": {"top_k": 40, "nested": [1, 2.50, {"z": null}]},'
    ' "seed":  7 }\r\n'
).encode("utf-8")


def test_hand_made_body_is_recorded_byte_for_byte(proxy):
    rid = "raw-bytes"
    path = f"/rollouts/{rid}/v1/chat/completions"
    r1 = h.raw_request(proxy.url, "POST", path, ODD_BODY)
    assert r1.status == 200 and r1.error is None
    assert r1.json()["choices"][0]["message"]["content"] == 'Reply to: café — naïve ☕ 😀 "quoted" \n line'

    stream_body = ODD_BODY.replace(b'"seed":  7', b'"seed":  7, "stream" : true')
    r2 = h.raw_request(proxy.url, "POST", path, stream_body)
    assert r2.status == 200 and r2.error is None
    assert r2.headers["content-type"].startswith("text/event-stream")
    assert r2.body.endswith(b"data: [DONE]\n\n")

    resp_body = (
        b'{"input": [{"role": "user", "content": [{"type": "input_text", "text": "\xc3\xa9t\xc3\xa9"}]}],'
        b'  "model": "scripted@events=2", "stream": true, "x_vendor": true}'
    )
    r3 = h.raw_request(proxy.url, "POST", f"/rollouts/{rid}/v1/responses", resp_body)
    assert r3.status == 200 and r3.error is None

    h.wait_for_shards(proxy.url)
    rows = rollout_rows(read_both(proxy.shards), rid)
    assert len(rows) == 3
    for row, body, resp in zip(rows, (ODD_BODY, stream_body, resp_body), (r1, r2, r3)):
        assert row["status"] == "ok"
        assert row["request"].encode("utf-8") == body
        assert row["upstream_request"] is None  # forwarded unchanged
        assert row["response_raw"] == resp.body
    assert rows[0]["stream"] is False and rows[1]["stream"] is True
    assert json.loads(rows[1]["response"])["choices"][0]["message"]["content"] == (
        'Reply to: café — naïve ☕ 😀 "quoted" \n line'
    )
    assert json.loads(rows[2]["response_message"])["content"] == "Reply to: été"

    # the same bytes seen by DuckDB
    got = h.duck(proxy.shards, f"SELECT request, response_raw FROM t WHERE rollout_id = '{rid}' ORDER BY sequence")
    assert [g[0].encode() for g in got] == [ODD_BODY, stream_body, resp_body]
    assert [g[1] for g in got] == [r1.body, r2.body, r3.body]


# ------------------------------------------------------- tagging, finish


def test_x_rollout_id_header_tagging(proxy):
    tee = h.TeeTransport()
    client = h.sdk_client(f"{proxy.url}/v1", tee=tee, default_headers={"X-Rollout-Id": "hdr-rollout-7"})
    c = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "tagged by header"}])
    assert c.choices[0].message.content == "Reply to: tagged by header"
    r = client.responses.create(model="scripted", input="header too")
    assert r.output_text == "Reply to: header too"

    h.wait_for_shards(proxy.url)
    rows = read_both(proxy.shards)
    assert {r["rollout_id"] for r in rows} == {"hdr-rollout-7"}
    check_against_tee(rollout_rows(rows, "hdr-rollout-7"), tee.exchanges, "hdr-rollout-7")
    got = h.duck(proxy.shards, "SELECT rollout_id, sequence, wire_api FROM t ORDER BY sequence")
    assert got == [("hdr-rollout-7", 0, "chat_completions"), ("hdr-rollout-7", 1, "responses")]


def test_finish_writes_rollout_row(proxy):
    rid = "finish-me"
    client = h.sdk_client(f"{proxy.url}/rollouts/{rid}/v1")
    for i in range(3):
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": f"turn {i}"}])
    meta = {"task": "swe-123", "tags": ["a", "b"], "score": {"pass": 3, "fail": 0}, "note": "ünïcode"}
    r = h.post_json(proxy.url, f"/v1/rollouts/{rid}/finish", {"status": "success", "reward": 0.75, "metadata": meta})
    assert r.status == 200, r.body
    fin = r.json()
    assert fin["rollout_id"] == rid and fin["calls"] == 3 and fin["record_id"]
    # a second rollout finished without reward or metadata
    r2 = h.post_json(proxy.url, "/v1/rollouts/never-called/finish", {"status": "abandoned"})
    assert r2.status == 200 and r2.json()["calls"] == 0

    h.wait_for_shards(proxy.url)
    rows = sorted(h.read_rollouts_arrow(proxy.shards), key=lambda r: r["rollout_id"])
    assert [r["rollout_id"] for r in rows] == ["finish-me", "never-called"]
    a, b = rows
    assert a["record_id"] == fin["record_id"]
    assert a["status"] == "success" and a["reward"] == 0.75 and a["calls"] == 3
    assert json.loads(a["metadata"]) == meta
    assert a["schema_version"] == 2 and a["finished_at"] is not None
    assert b["status"] == "abandoned" and b["reward"] is None and b["metadata"] is None and b["calls"] == 0

    d = h.duck(
        proxy.shards,
        "SELECT rollout_id, status, reward, calls, metadata FROM t ORDER BY rollout_id",
        kind="rollouts",
    )
    assert [x[:4] for x in d] == [("finish-me", "success", 0.75, 3), ("never-called", "abandoned", None, 0)]
    assert json.loads(d[0][4]) == meta
    # the calls it counted are the ones in the calls shards
    n = h.duck(proxy.shards, f"SELECT count(*) FROM t WHERE rollout_id = '{rid}' AND status = 'ok'")
    assert n == [(3,)]
