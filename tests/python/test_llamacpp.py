"""rollcall in front of a real llama.cpp server (PyPI `llama-cpp-python[server]`,
built and installed by `make test`), serving the shipped GGUF model
(SmolLM2-135M-Instruct Q4_1, the file `rollcall model fetch` caches).

Every case sends the same request directly to llama.cpp and through rollcall
(a route of kind "chat", so Responses and Messages calls are translated to
Chat Completions), and compares:

- Chat Completions: the bytes the client receives through rollcall equal
  llama.cpp's own, whole bodies and streams alike, once the per-call values
  (the `cmpl-<uuid>` inside `id` and the tool call ids, and `created`) are
  masked;
- Responses and Messages: the assembled answer (text, tool call name and
  arguments, logprobs) equals what the direct Chat Completions call produced,
  a translated stream is a valid event sequence, and the tool's name appears
  once (llama.cpp repeats `function.name` in every streamed tool-call chunk,
  which a translator must not concatenate);
- the recorded row: `status`, `tool_calls`, `completion_logprobs`, and usage
  equal to llama.cpp's numbers where it sent them, null (not 0) where it did
  not (llama.cpp never sends usage in a stream, `stream_options` or not).

How the tool call is made reliable. The server runs with `--chat_format
chatml` (SmolLM2's own template is ChatML). That handler turns a forced
`tool_choice: {"type": "function", "function": {"name": "get_weather"}}` into
a grammar built from the function's JSON schema, so even this 135M model
always answers with a well-formed `get_weather` call whose arguments are
`{"city": ...}`; and, unlike `chatml-function-calling` (which never passes
`logprobs` on to the sampler when a tool is forced), it returns logprobs for
the tool call's tokens as well. Every call asks for `logprobs: true,
top_logprobs: 1` (`top_logprobs` on Responses; Messages has no such field).

Determinism. temperature 0 is greedy sampling in llama.cpp, and a seed is
sent as well. llama.cpp is deterministic for the same evaluation, but
llama-cpp-python reuses the KV cache of the previous call's longest common
prefix and evaluates only the rest, so the first call of a prompt and a
repeat of it evaluate the prompt in different batches: measured here, their
logprobs differ by up to 0.016 (the second and third calls are identical).
Every case therefore first sends a warm-up call of the same prompt directly;
the direct call and the call through rollcall then start from the same cache
state, and are compared exactly (bytes, token logprobs), not just
semantically.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rollcall_harness as h

MODEL = "smollm2-135m"
MAX_TOKENS = 48
SEED = 1234
PROMPT_TOOL = "What is the weather in Paris?"
PROMPT_TEXT = "What is the capital of France? Answer in one sentence."

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city", "parameters": PARAMS}}
CHAT_TOOL_CHOICE = {"type": "function", "function": {"name": "get_weather"}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather",
                  "description": "Get the current weather in a city", "parameters": PARAMS}
MESSAGES_TOOL = {"name": "get_weather", "description": "Get the current weather in a city",
                 "input_schema": PARAMS}

STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
KIND = pytest.mark.parametrize("kind", ["tool", "text"])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def llama(tmp_path_factory, gguf):
    """`python -m llama_cpp.server` on a free loopback port: its base URL (no /v1)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail("llama-cpp-python is not installed in this interpreter: "
                    "`make .venv/.llamacpp-installed` (make test does) builds and installs it")
    d = tmp_path_factory.mktemp("llamacpp")
    port = free_port()
    log = open(d / "llama.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL,
         "--host", "127.0.0.1", "--port", str(port), "--n_threads", "2", "--n_ctx", "2048",
         "--chat_format", "chatml", "--disable_ping_events", "true", "--verbose", "false"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp server exited with {proc.returncode}:\n"
                            f"{(d / 'llama.log').read_text('utf-8', 'replace')[-4000:]}")
            try:
                if h.raw_request(url, "GET", "/v1/models", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama.cpp server not ready after 180 s:\n"
                            f"{(d / 'llama.log').read_text('utf-8', 'replace')[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def llama_proxy(llama, tmp_path_factory):
    toml = f"""
[shards]
max_age_secs = 0.2
[[routes]]
name = "llamacpp"
url = "{llama}/v1"
kind = "chat"
"""
    p = h.start_proxy(tmp_path_factory.mktemp("proxy"), llama, toml=toml)
    yield p
    p.kill()


# ---------------------------------------------------------------- helpers


def post(base: str, path: str, body: dict) -> h.RawResponse:
    r = h.post_json(base, path, body, timeout=300)
    assert r.status == 200, r.body[:2000]
    assert r.error is None, r.error
    return r


def chat_body(kind: str, stream: bool, seed: bool = True, logprobs: bool = True) -> dict:
    """The Chat Completions request of a case (also what a translated
    Responses / Messages call should become upstream)."""
    body: dict = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": stream}
    if seed:
        body["seed"] = SEED
    if logprobs:
        body |= {"logprobs": True, "top_logprobs": 1}
    if kind == "tool":
        body |= {"messages": [{"role": "user", "content": PROMPT_TOOL}],
                 "tools": [CHAT_TOOL], "tool_choice": CHAT_TOOL_CHOICE}
    else:
        body["messages"] = [{"role": "user", "content": PROMPT_TEXT}]
    return body


# llama.cpp's per-call values: `chatcmpl-<uuid>` / `call__0_<name>_cmpl-<uuid>`
# carry one uuid per call, and `created` the time.
UUID = rb"cmpl-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def masked(body: bytes) -> bytes:
    body = re.sub(UUID, b"cmpl-UUID", body)
    return re.sub(rb'"created": ?\d+', b'"created": 0', body)


def chunks(body: bytes) -> list:
    """The data of every SSE event of a chat stream, `[DONE]` as a string."""
    return [d if d == "[DONE]" else json.loads(d) for _, d in h.sse_events(body)]


def chat_answer(resp: h.RawResponse, stream: bool) -> dict:
    """What a client assembles from a direct Chat Completions answer: text,
    tool calls (name, arguments), token logprobs, usage."""
    if not stream:
        j = resp.json()
        c = j["choices"][0]
        m = c["message"]
        lp = c.get("logprobs")
        return {
            "text": m.get("content") or "",
            "tools": [(t["function"]["name"], t["function"]["arguments"]) for t in m.get("tool_calls") or []],
            "logprobs": [t["logprob"] for t in lp["content"]] if lp else None,
            "usage": j.get("usage"),
            "finish_reason": c["finish_reason"],
        }
    text, names, args, logprobs, usage, finish = "", {}, {}, None, None, None
    cs = chunks(resp.body)
    assert cs[-1] == "[DONE]"
    for ch in cs[:-1]:
        if ch.get("usage"):
            usage = ch["usage"]
        for c in ch["choices"]:
            d = c.get("delta") or {}
            text += d.get("content") or ""
            for t in d.get("tool_calls") or []:
                f = t.get("function") or {}
                if f.get("name"):
                    # llama.cpp names the function in every chunk of a call
                    assert names.setdefault(t["index"], f["name"]) == f["name"]
                args[t["index"]] = args.get(t["index"], "") + (f.get("arguments") or "")
            if c.get("logprobs"):
                logprobs = (logprobs or []) + [t["logprob"] for t in c["logprobs"]["content"]]
            finish = c.get("finish_reason") or finish
    return {"text": text, "tools": [(names[i], args[i]) for i in sorted(args)],
            "logprobs": logprobs, "usage": usage, "finish_reason": finish}


def direct(llama: str, body: dict) -> tuple[h.RawResponse, dict]:
    """Warm-up call, then the direct call that is compared (see the module
    docstring on determinism)."""
    post(llama, "/v1/chat/completions", body)
    r = post(llama, "/v1/chat/completions", body)
    return r, chat_answer(r, body["stream"])


def check_expected(kind: str, want: dict) -> None:
    """The direct answer is what the case is about."""
    if kind == "tool":
        assert len(want["tools"]) == 1 and want["tools"][0][0] == "get_weather", want
        assert set(json.loads(want["tools"][0][1])) == {"city"}, want
    else:
        assert want["text"].strip() and not want["tools"], want
    assert want["logprobs"], f"llama.cpp returned no logprobs: {want}"


def row_of(proxy: h.Proxy, rollout: str) -> dict:
    h.wait_for_shards(proxy.url)
    rows = h.rows_by_rollout(h.read_calls_arrow(proxy.shards)).get(rollout, [])
    assert len(rows) == 1, rows
    return rows[0]


class Checks:
    """Equalities that are all checked before the test fails, so that one
    failure lists every mismatch of its case."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def eq(self, what: str, got, want) -> None:
        if got != want:
            self.failed.append(f"{what}: got {got!r}, want {want!r}")

    def done(self) -> None:
        assert not self.failed, "\n".join(["", *self.failed])


def check_row(c: Checks, row: dict, want: dict, stream: bool, logprobs: bool) -> None:
    """The recorded row of a case against the direct answer `want`."""
    c.eq("row status", (row["status"], row["failure_class"], row["failure_message"]), ("ok", None, None))
    c.eq("row stream", row["stream"], stream)
    # null when the call went through natively (Chat Completions)
    c.eq("row upstream_api", row["upstream_api"],
         None if row["wire_api"] == "chat_completions" else "chat_completions")
    tools = json.loads(row["tool_calls"]) if row["tool_calls"] else []
    c.eq("row tool_calls names", [t["function"]["name"] for t in tools], [n for n, _ in want["tools"]])
    if row["wire_api"] == "messages":
        # Messages carries arguments as an object (`input`), never as
        # llama.cpp's string: the same JSON value is what counts.
        c.eq("row tool_calls arguments (as JSON)", [json.loads(t["function"]["arguments"]) for t in tools],
             [json.loads(a) for _, a in want["tools"]])
    else:
        c.eq("row tool_calls arguments", [t["function"]["arguments"] for t in tools], [a for _, a in want["tools"]])
    lp = row["completion_logprobs"]
    if logprobs:
        c.eq("row completion_logprobs present", lp is not None, True)
        if lp is not None:
            c.eq("row completion_logprobs length", len(lp), len(want["logprobs"]))
            c.eq("row completion_logprobs close to llama.cpp's",
                 all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300) for a, b in zip(lp, want["logprobs"])), True)
            # The very numbers llama.cpp sent (f32 values printed with 17
            # digits), parsed to the same f64 as Python parses them.
            c.eq("row completion_logprobs bit-exact", lp, want["logprobs"])
    else:
        c.eq("row completion_logprobs (not asked)", lp, None)
    got = {k: row[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    if stream:
        # llama.cpp sends no usage in a stream (it ignores include_usage):
        # nothing is known, so nothing may be recorded, least of all zeros.
        assert want["usage"] is None, want["usage"]
        c.eq("row usage (llama.cpp sent none)", got, dict.fromkeys(got))
    else:
        c.eq("row usage", got, {k: want["usage"][k] for k in got})


def typed_events(body: bytes) -> list[tuple[str, dict]]:
    """(event, data) of a Responses / Messages stream; each data's `type`
    is its event name."""
    out = []
    for ev, data in h.sse_events(body):
        d = json.loads(data)
        assert ev == d.get("type"), (ev, data)
        out.append((ev, d))
    return out


# ---------------------------------------------------------------- Chat Completions


@KIND
@STREAM
def test_chat_completions_through_rollcall_equal_llamacpp(kind, stream, llama, llama_proxy):
    body = chat_body(kind, stream)
    d, want = direct(llama, body)
    check_expected(kind, want)
    rollout = f"chat-{kind}-{'stream' if stream else 'whole'}"
    r = post(llama_proxy.url, f"/rollouts/{rollout}/v1/chat/completions", body)

    c = Checks()
    # Byte for byte what llama.cpp sends, per-call ids and times masked.
    c.eq("client bytes (masked)", masked(r.body), masked(d.body))
    if stream:
        c.eq("content-type", r.headers["content-type"].split(";")[0], "text/event-stream")
    c.eq("client answer", chat_answer(r, stream), want)

    row = row_of(llama_proxy, rollout)
    c.eq("row wire_api", row["wire_api"], "chat_completions")
    check_row(c, row, want, stream, logprobs=True)
    # The harness's bytes are what the client received.
    c.eq("row response_raw", row["response_raw"], r.body)
    c.done()


# ---------------------------------------------------------------- Responses


@KIND
@STREAM
def test_responses_translated_equal_llamacpp_chat(kind, stream, llama, llama_proxy):
    d, want = direct(llama, chat_body(kind, stream))
    check_expected(kind, want)
    req: dict = {"model": MODEL, "temperature": 0, "seed": SEED, "max_output_tokens": MAX_TOKENS,
                 "top_logprobs": 1, "stream": stream}
    if kind == "tool":
        req |= {"input": PROMPT_TOOL, "tools": [RESPONSES_TOOL],
                "tool_choice": {"type": "function", "name": "get_weather"}}
    else:
        req["input"] = PROMPT_TEXT
    rollout = f"responses-{kind}-{'stream' if stream else 'whole'}"
    r = post(llama_proxy.url, f"/rollouts/{rollout}/v1/responses", req)
    want_fc = [(n, a) for n, a in want["tools"]]

    c = Checks()
    if stream:
        evs = typed_events(r.body)
        names = [e for e, _ in evs]
        assert names[:2] == ["response.created", "response.in_progress"], names
        assert names[-1] == "response.completed" and names.count("response.completed") == 1, names
        seqs = [d["sequence_number"] for _, d in evs]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        added = [d["item"] for e, d in evs if e == "response.output_item.added"]
        done = [d["item"] for e, d in evs if e == "response.output_item.done"]
        assert [i["type"] for i in added] == [i["type"] for i in done], (added, done)
        final = evs[-1][1]["response"]
        c.eq("output_text deltas", "".join(d["delta"] for e, d in evs if e == "response.output_text.delta"),
             want["text"])
        c.eq("output_item.added function_call names",
             [i["name"] for i in added if i["type"] == "function_call"], [n for n, _ in want_fc])
        c.eq("output_item.done function_call (name, arguments)",
             [(i["name"], i["arguments"]) for i in done if i["type"] == "function_call"], want_fc)
        c.eq("function_call_arguments deltas",
             "".join(d["delta"] for e, d in evs if e == "response.function_call_arguments.delta"),
             "".join(a for _, a in want_fc))
        c.eq("function_call_arguments.done",
             [d["arguments"] for e, d in evs if e == "response.function_call_arguments.done"],
             [a for _, a in want_fc])
    else:
        final = r.json()
        assert final["object"] == "response", final
        u = final.get("usage") or {}
        c.eq("usage", (u.get("input_tokens"), u.get("output_tokens")),
             (want["usage"]["prompt_tokens"], want["usage"]["completion_tokens"]))

    what = "response.completed" if stream else "response"
    c.eq(f"{what} status", final["status"], "completed")
    c.eq(f"{what} function_call (name, arguments)",
         [(o["name"], o["arguments"]) for o in final["output"] if o["type"] == "function_call"], want_fc)
    c.eq(f"{what} output_text",
         "".join(p.get("text", "") for o in final["output"] if o["type"] == "message"
                 for p in o["content"] if p["type"] == "output_text"), want["text"])

    row = row_of(llama_proxy, rollout)
    c.eq("row wire_api", row["wire_api"], "responses")
    up = json.loads(row["upstream_request"])
    c.eq("upstream messages", up["messages"],
         [{"role": "user", "content": PROMPT_TOOL if kind == "tool" else PROMPT_TEXT}])
    check_row(c, row, want, stream, logprobs=True)
    c.done()


# ---------------------------------------------------------------- Messages


@KIND
@STREAM
def test_messages_translated_equal_llamacpp_chat(kind, stream, llama, llama_proxy):
    # Messages has neither a seed nor logprobs: the direct call has neither.
    d, want = direct(llama, chat_body(kind, stream, seed=False, logprobs=False))
    if kind == "tool":
        assert len(want["tools"]) == 1 and want["tools"][0][0] == "get_weather", want
    else:
        assert want["text"].strip() and not want["tools"], want
    req: dict = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": stream}
    if kind == "tool":
        req |= {"messages": [{"role": "user", "content": PROMPT_TOOL}], "tools": [MESSAGES_TOOL],
                "tool_choice": {"type": "tool", "name": "get_weather"}}
    else:
        req["messages"] = [{"role": "user", "content": PROMPT_TEXT}]
    rollout = f"messages-{kind}-{'stream' if stream else 'whole'}"
    r = post(llama_proxy.url, f"/rollouts/{rollout}/v1/messages", req)
    want_tools = [(n, json.loads(a)) for n, a in want["tools"]]

    c = Checks()
    if stream:
        evs = typed_events(r.body)
        names = [e for e, _ in evs]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
        starts = [d for e, d in evs if e == "content_block_start"]
        stops = [d["index"] for e, d in evs if e == "content_block_stop"]
        assert [s["index"] for s in starts] == stops == list(range(len(starts))), names
        tool_starts = [s["content_block"] for s in starts if s["content_block"]["type"] == "tool_use"]
        deltas = [d["delta"] for e, d in evs if e == "content_block_delta"]
        text = "".join(x["text"] for x in deltas if x["type"] == "text_delta")
        args = "".join(x["partial_json"] for x in deltas if x["type"] == "input_json_delta")
        stop_reason = evs[-2][1]["delta"]["stop_reason"]
        c.eq("content_block_start tool_use names", [t["name"] for t in tool_starts], [n for n, _ in want_tools])
        c.eq("input_json_delta", args, "".join(a for _, a in want["tools"]))
        got_tools = [(t["name"], json.loads(args)) for t in tool_starts]
    else:
        j = r.json()
        assert j["type"] == "message" and j["role"] == "assistant", j
        text = "".join(b["text"] for b in j["content"] if b["type"] == "text")
        got_tools = [(b["name"], b["input"]) for b in j["content"] if b["type"] == "tool_use"]
        stop_reason = j["stop_reason"]
        c.eq("usage", (j["usage"]["input_tokens"], j["usage"]["output_tokens"]),
             (want["usage"]["prompt_tokens"], want["usage"]["completion_tokens"]))
    c.eq("text", text, want["text"])
    c.eq("tool_use (name, input)", got_tools, want_tools)
    c.eq("stop_reason", stop_reason, "tool_use" if kind == "tool" else
         "max_tokens" if want["finish_reason"] == "length" else "end_turn")

    row = row_of(llama_proxy, rollout)
    c.eq("row wire_api", row["wire_api"], "messages")
    check_row(c, row, want, stream, logprobs=False)
    c.done()
