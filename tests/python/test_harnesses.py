"""Real harness CLIs (Codex, OpenClaw, ZeroClaw, mini-swe-agent, opencode)
run unchanged through `rollcall run`, against the scripted upstream (a real
HTTP server standing in for a model server), through a real proxy. The
shards are read back with pyarrow.

The task is a scripted two-turn tool call: the model runs
`echo rollcall-$((6*7)) | tee proof.txt` with the harness's shell tool, reads
the result, then answers with what the command printed. Only a shell that
really ran the command can produce `rollcall-42`.

Harnesses come from `rollcall harness install --prefix .harnesses` (done by
`make test`). A missing harness fails its test: it is never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import rollcall_harness as h

HARNESS_DIR = Path(os.environ.get("ROLLCALL_HARNESS_DIR", h.REPO_ROOT / ".harnesses"))
HARNESSES = ["codex", "openclaw", "zeroclaw", "mini-swe-agent", "opencode", "claude-code"]
WIRE = {"codex": "responses", "claude-code": "messages"}

COMMAND = "echo rollcall-$((6*7)) | tee proof.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def task(name: str, rollout: str) -> str:
    if name == "mini-swe-agent":
        # mini-swe-agent ends a task when the model runs its submit command.
        return f"[task {rollout}] Run [[run: {COMMAND}]] and then submit with [[run: {SUBMIT}]]."
    return f"[task {rollout}] Run [[run: {COMMAND}]] and tell me what it printed."


def key_of(rollout: str) -> str:
    return f"sk-harness-secret-{rollout}"


# Calls each harness makes for the task: opencode first asks for a title.
EXPECTED_CALLS = {"codex": 2, "openclaw": 2, "zeroclaw": 2, "mini-swe-agent": 2, "opencode": 3,
                  "claude-code": 2}


def need(name: str) -> None:
    if not (HARNESS_DIR / name / ".rollcall-installed").exists():
        pytest.fail(f"{name} is not installed in {HARNESS_DIR}: run `rollcall harness install {name} --prefix {HARNESS_DIR}`")


def start_run(proxy: h.Proxy, name: str, rollout: str, workdir: Path, model: str = "scripted",
              env: dict | None = None, timeout: int = 600, extra: list[str] | None = None) -> subprocess.Popen:
    workdir.parent.mkdir(parents=True, exist_ok=True)
    log = open(workdir.parent / f"{rollout}.log", "wb")
    args = [h.rollcall_bin(), "run", "--harness", name, "--rollout", rollout, "--model", model,
            "--workdir", str(workdir), "--proxy", proxy.url, "--prefix", str(HARNESS_DIR),
            "--home", str(workdir.parent / f"{rollout}.home"), "--timeout", str(timeout),
            "--api-key", key_of(rollout), *(extra or []), "--", task(name, rollout)]
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})


def finish_run(p: subprocess.Popen, timeout: float = 700) -> tuple[int, str]:
    rc = p.wait(timeout=timeout)
    p.stdout = None
    log = Path(p.args[p.args.index("--home") + 1].removesuffix(".home") + ".log")
    return rc, log.read_text(errors="replace")


def tool_results(request: dict) -> list[tuple[str, str]]:
    """(call id, output text) of every tool result in a chat or responses request."""
    out = []
    for m in request.get("messages", []):
        if m.get("role") == "tool":
            c = m.get("content")
            text = c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [])
            out.append((m.get("tool_call_id", ""), text))
    for m in request.get("messages", []):
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if b.get("type") == "tool_result":
                c = b.get("content")
                text = c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [])
                out.append((b.get("tool_use_id", ""), text))
    for item in request.get("input", []) if isinstance(request.get("input"), list) else []:
        if item.get("type") == "function_call_output":
            o = item.get("output")
            text = o if isinstance(o, str) else json.dumps(o)
            out.append((item.get("call_id", ""), text))
    return out


def sent_tool_calls(request: dict) -> list[tuple[str, str, str]]:
    """(call id, name, arguments) of the assistant tool calls a harness sends back."""
    out = []
    for m in request.get("messages", []):
        for tc in m.get("tool_calls") or []:
            out.append((tc.get("id", ""), tc["function"]["name"], tc["function"]["arguments"]))
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if b.get("type") == "tool_use":
                out.append((b.get("id", ""), b["name"], json.dumps(b.get("input"))))
    for item in request.get("input", []) if isinstance(request.get("input"), list) else []:
        if item.get("type") == "function_call":
            out.append((item.get("call_id", ""), item["name"], item["arguments"]))
    return out


def command_of(arguments: str) -> str:
    args = json.loads(arguments)
    for k in ("command", "cmd", "commands"):
        if k in args:
            v = args[k]
            return v[-1] if isinstance(v, list) else v
    raise AssertionError(f"no command in tool arguments {arguments}")


def same_id(a: str, b: str) -> bool:
    """Tool-call ids as the model gave them and as the harness returns them.
    OpenClaw drops punctuation from ids (call_5 comes back as call5)."""
    def norm(s: str) -> str:
        return "".join(ch for ch in s if ch.isalnum())
    return a == b or norm(a) == norm(b)


def check_rollout(name: str, rollout: str, rows: list[dict], finishes: list[dict], workdir: Path) -> None:
    """The shards of one successful two-turn tool-call rollout."""
    assert rows, f"no calls recorded for {rollout}"
    assert all(r["rollout_id"] == rollout for r in rows)
    assert [r["sequence"] for r in rows] == list(range(len(rows))), "sequence numbers are dense and in order"
    assert len(rows) == EXPECTED_CALLS[name], [json.loads(r["request"]).get("messages", "")[-1:] for r in rows]
    assert all(r["status"] == "ok" and r["failure_class"] is None for r in rows)
    assert [r["received_at"] for r in rows] == sorted(r["received_at"] for r in rows)

    # The model's tool call, as recorded in the response...
    calling = [r for r in rows if r["tool_calls"]]
    assert len(calling) >= 1
    call = json.loads(calling[0]["tool_calls"])[0]
    assert command_of(call["function"]["arguments"]) == COMMAND
    # ... then the harness sends it back with the tool's real output.
    later = rows[rows.index(calling[0]) + 1]
    request = json.loads(later["request"])
    sent = sent_tool_calls(request)
    assert any(same_id(i, call["id"]) and n == call["function"]["name"] for i, n, _ in sent), sent
    results = tool_results(request)
    assert any(same_id(i, call["id"]) and "rollcall-42" in out for i, out in results), results
    assert (workdir / "proof.txt").read_text().strip() == "rollcall-42", "the tool ran in the workdir"

    last = rows[-1]
    if name == "mini-swe-agent":
        assert command_of(json.loads(last["tool_calls"])[0]["function"]["arguments"]) == SUBMIT
    else:
        assert "rollcall-42" in json.loads(last["response_message"])["content"]
    assert last["request"] is not None and last["response_raw"]

    assert len(finishes) == 1, finishes
    fin = finishes[0]
    assert fin["status"] == "completed"
    meta = json.loads(fin["metadata"])
    assert meta["harness"] == name and meta["exit_code"] == 0 and meta["duration_s"] > 0
    assert fin["calls"] == len(rows)

    # No cross-talk: every request names this rollout's task and no other.
    for r in rows:
        assert f"[task {rollout}]" in r["request"]
        assert r["request"].count("[task ") == r["request"].count(f"[task {rollout}]")


def assert_keys_not_recorded(proxy: h.Proxy, rollouts: list[str]) -> None:
    data = b"".join(f.read_bytes() for kind in ("calls", "rollouts") for f in h.shard_files(proxy.shards, kind))
    data += proxy.stderr_text().encode()
    for r in rollouts:
        assert key_of(r).encode() not in data


def shards_of(proxy: h.Proxy) -> tuple[dict, dict]:
    h.wait_for_shards(proxy.url)
    calls = h.rows_by_rollout(h.read_calls_arrow(proxy.shards))
    fins: dict[str, list] = {}
    for f in h.read_rollouts_arrow(proxy.shards):
        fins.setdefault(f["rollout_id"], []).append(f)
    return calls, fins


@pytest.mark.parametrize("name", HARNESSES)
def test_harness_two_turn_tool_task(name, proxy, tmp_path):
    need(name)
    workdir = tmp_path / "work"
    rollout = f"e2e-{name}"
    rc, out = finish_run(start_run(proxy, name, rollout, workdir))
    assert rc == 0, out[-3000:]
    assert f"rollout {rollout} completed" in out
    if name != "mini-swe-agent":
        assert "rollcall-42" in out, out[-3000:]
    calls, fins = shards_of(proxy)
    check_rollout(name, rollout, calls.get(rollout, []), fins.get(rollout, []), workdir)
    assert_keys_not_recorded(proxy, [rollout])
    wire = {r["wire_api"] for r in calls[rollout]}
    assert wire == {WIRE.get(name, "chat_completions")}


def test_twenty_harnesses_at_once(proxy, tmp_path):
    mix = (["codex"] * 4 + ["claude-code"] * 3 + ["mini-swe-agent"] * 4 + ["opencode"] * 3
           + ["openclaw"] * 3 + ["zeroclaw"] * 3)
    assert len(mix) == 20
    for name in set(mix):
        need(name)
    runs = []
    for i, name in enumerate(mix):
        workdir = tmp_path / f"w{i}"
        rollout = f"mix-{i:02d}-{name}"
        runs.append((name, rollout, workdir, start_run(proxy, name, rollout, workdir, timeout=900)))
        time.sleep(0.2)
    for name, rollout, _, p in runs:
        rc, out = finish_run(p, timeout=1000)
        assert rc == 0, f"{rollout}: {out[-3000:]}"
    calls, fins = shards_of(proxy)
    assert set(calls) == {r for _, r, _, _ in runs}, "no calls under any other rollout id"
    for name, rollout, workdir, _ in runs:
        check_rollout(name, rollout, calls[rollout], fins.get(rollout, []), workdir)
    assert_keys_not_recorded(proxy, [r for _, r, _, _ in runs])


# Faults the scripted upstream injects, per harness, and what the shards must say.
FAILURES = [
    ("codex", "scripted@fault=400", "upstream_client_error", {}),
    ("opencode", "scripted@fault=400", "upstream_client_error", {}),
    # mini-swe-agent retries errors ten times with backoff unless told otherwise.
    ("mini-swe-agent", "scripted@fault=500", "upstream_server_error", {"MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"}),
]


@pytest.mark.parametrize("name,model,failure,env", FAILURES, ids=[f[0] for f in FAILURES])
def test_harness_reports_upstream_failure(name, model, failure, env, proxy, tmp_path):
    need(name)
    rollout = f"fail-{name}"
    rc, out = finish_run(start_run(proxy, name, rollout, tmp_path / "work", model=model, env=env, timeout=300))
    assert rc not in (0, 124), out[-3000:]
    assert "scripted" in out and ("bad request" in out or "internal error" in out), out[-3000:]
    calls, fins = shards_of(proxy)
    rows = calls[rollout]
    assert rows and all(r["status"] == "failed" and r["failure_class"] == failure for r in rows)
    assert all(r["http_status"] == int(model[-3:]) for r in rows)
    assert fins[rollout][0]["status"] == "failed"
    assert json.loads(fins[rollout][0]["metadata"])["exit_code"] == rc


def test_run_errors_are_clear(proxy, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([h.rollcall_bin(), "run", *args], capture_output=True, text=True, timeout=60)

    r = run("--harness", "nope", "--rollout", "x", "--proxy", proxy.url, "--", "hi")
    assert r.returncode != 0 and 'unknown harness "nope"' in r.stderr and "codex" in r.stderr
    r = run("--harness", "codex", "--rollout", "x", "--proxy", proxy.url, "--prefix", str(tmp_path / "none"), "--", "hi")
    assert r.returncode != 0 and "rollcall harness install codex" in r.stderr
    need("codex")
    r = run("--harness", "codex", "--rollout", "x", "--proxy", "http://127.0.0.1:9", "--prefix", str(HARNESS_DIR), "--", "hi")
    assert r.returncode != 0 and "not reachable" in r.stderr
    r = run("--harness", "codex", "--rollout", "bad/id", "--proxy", proxy.url, "--prefix", str(HARNESS_DIR), "--", "hi")
    assert r.returncode != 0 and "invalid rollout id" in r.stderr
    r = subprocess.run([h.rollcall_bin(), "harness", "install"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--all" in r.stderr


def test_run_timeout_stops_the_harness_and_finishes_the_rollout(proxy, tmp_path):
    need("codex")
    # The upstream never answers; rollcall run gives up after 3 s.
    rc, out = finish_run(start_run(proxy, "codex", "slow-codex", tmp_path / "work",
                                   model="scripted@fault=timeout", timeout=3), timeout=60)
    assert rc == 124, out[-2000:]
    assert "rollout slow-codex timeout" in out
    _, fins = shards_of(proxy)
    fin = fins["slow-codex"][0]
    assert fin["status"] == "timeout"
    assert json.loads(fin["metadata"])["exit_code"] is None



def routed_proxy(make_proxy, upstream_url: str, kind: str) -> h.Proxy:
    return make_proxy(toml=f"""
[shards]
max_age_secs = 0.2
[[routes]]
name = "only"
url = "{upstream_url}/v1"
kind = "{kind}"
""", name=kind)


@pytest.fixture
def chat_only_upstream(tmp_path):
    """The scripted upstream restricted to Chat Completions (and Completions):
    Responses and Messages requests get 404 there."""
    proc = h.start_upstream(tmp_path, apis="chat,completions", name="chat-only")
    yield proc.url
    proc.kill()


@pytest.mark.parametrize("name", ["codex", "claude-code"])
def test_harness_through_translation_to_a_chat_only_upstream(name, make_proxy, chat_only_upstream, tmp_path):
    need(name)
    proxy = routed_proxy(make_proxy, chat_only_upstream, "chat")
    rollout = f"chat-only-{name}"
    workdir = tmp_path / "work"
    rc, out = finish_run(start_run(proxy, name, rollout, workdir))
    assert rc == 0, out[-3000:]
    assert "rollcall-42" in out
    calls, fins = shards_of(proxy)
    rows = calls[rollout]
    check_rollout(name, rollout, rows, fins.get(rollout, []), workdir)
    assert {r["wire_api"] for r in rows} == {WIRE[name]}
    assert {r["upstream_api"] for r in rows} == {"chat_completions"}
    # What went upstream is Chat Completions, tool result included.
    up = json.loads(rows[1]["upstream_request"])
    assert up["messages"][-1]["role"] == "tool" and "rollcall-42" in up["messages"][-1]["content"]


def test_claude_code_against_a_native_messages_upstream(make_proxy, upstream, tmp_path):
    need("claude-code")
    proxy = routed_proxy(make_proxy, upstream, "anthropic")
    rollout = "native-claude"
    workdir = tmp_path / "work"
    rc, out = finish_run(start_run(proxy, "claude-code", rollout, workdir))
    assert rc == 0, out[-3000:]
    calls, fins = shards_of(proxy)
    rows = calls[rollout]
    check_rollout("claude-code", rollout, rows, fins.get(rollout, []), workdir)
    assert {r["upstream_api"] for r in rows} == {None}
    assert all(r["upstream_request"] is None for r in rows), "forwarded byte for byte"
    assert all(r["user_agent"].startswith("claude-cli/") for r in rows)


def test_live_harness_runs_export_to_datasets(make_proxy, upstream, tmp_path):
    """Real harness rollouts on a vLLM-kind route (token ids and logprobs
    recorded), finished by `rollcall run`, become SFT conversations and
    token-exact RL samples."""
    names = ["codex", "claude-code", "mini-swe-agent", "zeroclaw"]
    for n in names:
        need(n)
    proxy = routed_proxy(make_proxy, upstream, "vllm")
    for n in names:
        rc, out = finish_run(start_run(proxy, n, f"live-{n}", tmp_path / n / "work"))
        assert rc == 0, out[-3000:]
    h.wait_for_shards(proxy.url)
    out = tmp_path / "ds"
    for kind in ("sft", "rl"):
        # `rollcall run` without --check gives no reward; RL drops unrewarded
        # rollouts by default (checked below), so ask for 0.
        extra = ["--missing-reward", "zero"] if kind == "rl" else []
        p = subprocess.run([h.rollcall_bin(), "export", kind, "--shards", str(proxy.shards), "--out", str(out / kind),
                            *extra], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    import pyarrow.parquet as pq
    sft = pq.read_table(out / "sft" / "sft.parquet").to_pylist()
    assert sorted(r["rollout_id"] for r in sft) == sorted(f"live-{n}" for n in names), "one segment per rollout"
    for r in sft:
        roles = [m["role"] for m in r["messages"]]
        assert "tool" in roles and roles[-1] == "assistant"
        assert r["loss_weights"] == [1.0 if role == "assistant" else 0.0 for role in roles]
        assert r["status"] == "completed"
    rl = pq.read_table(out / "rl" / "rl.parquet").to_pylist()
    assert sorted(r["rollout_id"] for r in rl) == sorted(f"live-{n}" for n in names)
    assert json.loads((out / "rl" / "rl_report.json").read_text())["missing_reward"] == len(names)
    for r in rl:
        assert len(r["response_ids"]) == len(r["loss_mask"]) == len(r["logprobs"])
        assert 0 in r["loss_mask"] and 1 in r["loss_mask"], "actions and observations interleaved"
