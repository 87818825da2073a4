"""A minimal tool-using agent harness, used by `make demo` until real harnesses
run against the embedded model.

It speaks Chat Completions or Responses through the official `openai` SDK,
offers one `bash` tool, runs each command the model asks for in its working
directory, and sends the output back, until the model answers in text.

    python agent.py --base-url http://127.0.0.1:8700/rollouts/r1/v1 \
        --api chat --stream --workdir /tmp/w "create hello.txt"
"""

import argparse
import json
import subprocess

from openai import OpenAI

BASH = {
    "name": "bash",
    "description": "Run a bash command in the task's working directory.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def run_bash(command, workdir):
    p = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=30)
    return {"exit_code": p.returncode, "output": (p.stdout + p.stderr)[-4000:]}


def chat_turn(client, model, messages, stream):
    tools = [{"type": "function", "function": BASH}]
    if not stream:
        m = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0].message
        calls = [(c.id, c.function.name, c.function.arguments) for c in (m.tool_calls or [])]
        return m.content, calls
    content, calls = "", {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True,
                                                stream_options={"include_usage": True}):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                c["id"] = tc.id or c["id"]
                c["name"] += (tc.function and tc.function.name) or ""
                c["args"] += (tc.function and tc.function.arguments) or ""
    return content, [(c["id"], c["name"], c["args"]) for c in calls.values()]


def run(base_url, task, workdir, api="chat", stream=False, model="scripted", max_turns=6):
    """Run the task; return (final answer, list of tool results)."""
    client = OpenAI(base_url=base_url, api_key="demo-key", max_retries=0)
    results = []
    if api == "chat":
        messages = [{"role": "system", "content": "You are a coding agent. Use bash."}, {"role": "user", "content": task}]
        for _ in range(max_turns):
            content, calls = chat_turn(client, model, messages, stream)
            if not calls:
                return content, results
            messages.append({"role": "assistant", "content": content or None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]})
            for call_id, _, args in calls:
                r = run_bash(json.loads(args or "{}").get("command", "true"), workdir)
                results.append(r)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(r)})
        return None, results
    items = [{"role": "user", "content": task}]
    tools = [{"type": "function", **BASH}]
    for _ in range(max_turns):
        if stream:
            final = None
            with client.responses.stream(model=model, instructions="You are a coding agent. Use bash.", input=items, tools=tools) as s:
                for _ev in s:
                    pass
                final = s.get_final_response()
        else:
            final = client.responses.create(model=model, instructions="You are a coding agent. Use bash.", input=items, tools=tools)
        calls = [o for o in final.output if o.type == "function_call"]
        if not calls:
            return final.output_text, results
        for c in calls:
            items.append({"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments})
            r = run_bash(json.loads(c.arguments or "{}").get("command", "true"), workdir)
            results.append(r)
            items.append({"type": "function_call_output", "call_id": c.call_id, "output": json.dumps(r)})
    return None, results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api", choices=["chat", "responses"], default="chat")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--model", default="scripted")
    ap.add_argument("task")
    a = ap.parse_args()
    answer, results = run(a.base_url, a.task, a.workdir, a.api, a.stream, a.model)
    print(json.dumps({"answer": answer, "tool_results": results}))
