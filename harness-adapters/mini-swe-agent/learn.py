#!/usr/bin/env python3
"""`make learn`: the loop on one CPU machine, and the curve it draws.

The shipped model (SmolLM2-135M-Instruct) learns a task family in its own
harness, mini-swe-agent, every rollout in a Docker container graded by
hidden tests, every call recorded by `rollcall serve`:

1. a fresh split of the `learn` task family (fixtures/tasks/learn/generate,
   --seed): training and held-out tasks, one image each;
2. baseline: held-out resolved@1 (one greedy rollout per task, a job);
3. distillation: a scripted teacher that knows each training task's gold
   commands answers through the same harness (a `vllm` route, with the
   student's token ids); the rollouts are exported token-exact (`rollcall
   export sft`), trained with TRL's SFTTrainer on the CPU, and the weights
   hot-loaded into the running route as policy version 1;
4. RL: GRPO steps through the job API with `rollcall_data.trl.Online`, the
   weights pushed after every step as the next policy version;
5. held-out resolved@1 after each phase and each GRPO step: printed, written
   to OUT/curve.json and plotted to OUT/learn-curve.png. `rollcall view
   --shards OUT/shards` draws the same curve from the shards (the rollouts
   list filtered to `heldout`, the plot "reward by policy version").

Runs in the trainers' venv (TRL, transformers, matplotlib; `make learn`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "smol"
TEACHER = "teacher"
# mini-swe-agent as the small model can follow it: its text format, a short
# system prompt, the issue as the task, one step (the fix is one bash block).
HARNESS_ARGS = [
    "-c", "mini_textbased.yaml", "-c", "model.model_class=litellm_textbased",
    "-c", r"model.action_regex=\A(?:(?!```).)*```(?:mswea_bash_command|bash|sh)?[ \t]*\n(.*?)\n```",
    "-c", "agent.system_template=You are a helpful assistant that runs shell commands. "
          "Answer with one bash code block that fixes the issue.",
    "-c", "agent.instance_template={{task}}",
    "-c", "agent.step_limit=1",
]
GREEDY = ["-c", "model.model_kwargs.temperature=0"]
# GRPO samples at temperature 1, the temperature GRPOConfig computes its
# log-probabilities at (its default), so the ratio it takes is of one policy.
SAMPLED = ["-c", "model.model_kwargs.temperature=1.0"]

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[learn {time.monotonic() - T0:7.1f} s] {msg}", flush=True)


# ------------------------------------------------------------------ teacher


def teacher_answer(commands: list[str]) -> str:
    return "```bash\n" + "\n".join(commands) + "\n```"


class Teacher(ThreadingHTTPServer):
    """A scripted teacher behind a `vllm` route: it answers a training task's
    issue with the task's gold commands, and returns the ids of the prompt
    (the student's chat template) and of its answer (the student's
    tokenizer, ending with the end-of-turn token) as vLLM does with
    `return_token_ids`, so the rows it leaves are the student's tokens. It
    never sees a held-out task: gold.json holds training tasks only."""

    daemon_threads = True

    def __init__(self, tokenizer, gold: dict):
        super().__init__(("127.0.0.1", 0), TeacherHandler)
        self.tok = tokenizer
        self.gold = gold
        self.lock = threading.Lock()
        self.calls = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def complete(self, body: dict) -> tuple[int, dict]:
        msgs = [{"role": m["role"], "content": m["content"] if isinstance(m.get("content"), str) else "".join(
            p.get("text", "") for p in m.get("content") or [])} for m in body.get("messages", [])]
        users = "\n".join(m["content"] for m in msgs if m["role"] == "user")
        found = [g["commands"] for g in self.gold.values() if g["problem_statement"] in users]
        if len(found) != 1:
            return 400, {"error": {"message": f"the teacher knows no single training task in this prompt "
                                              f"({len(found)} match)", "type": "invalid_request_error"}}
        answer = teacher_answer(found[0])
        with self.lock:
            prompt = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
                prompt = prompt["input_ids"]
            completion = self.tok.encode(answer, add_special_tokens=False) + [self.tok.convert_tokens_to_ids(
                "<|im_end|>")]
            self.calls += 1
            n = self.calls
        choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop",
                  "logprobs": None}
        out = {"id": f"chatcmpl-teacher-{n}", "object": "chat.completion", "created": int(time.time()),
               "model": body.get("model", TEACHER), "choices": [choice],
               "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                         "total_tokens": len(prompt) + len(completion)}}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = list(prompt)
            choice["token_ids"] = completion
        return 200, out


class TeacherHandler(BaseHTTPRequestHandler):
    server: Teacher

    def log_message(self, *a):  # quiet: rollcall records every call
        pass

    def send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": TEACHER, "object": "model"}]})
        else:
            self.send(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError as e:
            return self.send(400, {"error": {"message": f"invalid JSON: {e}", "type": "invalid_request_error"}})
        if self.path != "/v1/chat/completions":
            return self.send(404, {"error": {"message": f"the teacher serves /v1/chat/completions, not {self.path}",
                                             "type": "not_found"}})
        if body.get("stream"):
            return self.send(400, {"error": {"message": "the teacher does not stream",
                                             "type": "invalid_request_error"}})
        self.send(*self.server.complete(body))


# ------------------------------------------------------------------ phases


def serve(a, teacher: Teacher, out: Path, admin: str) -> tuple[subprocess.Popen, str]:
    cfg = out / "serve.toml"
    cfg.write_text(f"""# written by make learn
[server]
admin_keys_env = "ROLLCALL_LEARN_ADMIN_KEYS"
[shards]
max_age_secs = 3600
[[routes]]
name = "{ROUTE}"
models = ["{ROUTE}"]
kind = "embedded"
[routes.embedded]
model_file = "{a.model_file}"
default_max_tokens = 96
kv_slots = 4
[[routes]]
name = "{TEACHER}"
models = ["{TEACHER}"]
url = "{teacher.url}"
kind = "vllm"
""")
    env = dict(os.environ, ROLLCALL_LEARN_ADMIN_KEYS=admin, ROLLCALL_HARNESS_DIR=str(a.harness_dir))
    log_path = out / "serve.log"
    p = subprocess.Popen([str(a.bin), "serve", "--config", str(cfg), "--listen", "127.0.0.1:0",
                          "--shards", str(out / "shards")], stdout=subprocess.PIPE, stderr=open(log_path, "w"),
                         text=True, env=env)
    line = p.stdout.readline().strip()
    prefix = "rollcall listening on "
    if not line.startswith(prefix):
        p.kill()
        sys.exit(f"learn: rollcall did not start ({line!r}); see {log_path}:\n{log_path.read_text()[-2000:]}")
    return p, line[len(prefix):]


def job(a, tasks: Path, model: str, args: list[str], **extra) -> dict:
    return {"tasks": str(tasks.resolve()), "harness": "mini-swe-agent", "model": model,
            "concurrency": a.concurrency, "timeout_secs": 300, "grade_timeout_secs": 300,
            "harness_args": HARNESS_ARGS + args, **extra}


def run_job(client, spec: dict) -> list[dict]:
    """Submit, wait for every group; the samples."""
    jid = client.submit(spec)
    samples = [s for g in client.groups(jid, deadline=3600) for s in g["samples"]]
    st = client.status(jid)
    if st["state"] != "done":
        sys.exit(f"learn: job {jid} ended {st['state']}: {st.get('error')}")
    return samples


def evaluate(a, client, version: int, phase: str) -> dict:
    t = time.monotonic()
    samples = run_job(client, job(a, a.tasks / "heldout.jsonl", ROUTE, GREEDY, samples=1,
                                  min_policy_version=version))
    resolved = sum(1 for s in samples if s.get("resolved"))
    infra = sum(1 for s in samples if s["status"] == "infra_error")
    point = {"phase": phase, "policy_version": version, "resolved": resolved, "tasks": len(samples),
             "resolved_at_1": resolved / max(len(samples), 1), "infra_errors": infra,
             "seconds": round(time.monotonic() - t, 1)}
    log(f"held-out resolved@1 at policy version {version} ({phase}): {resolved}/{len(samples)}"
        + (f" ({infra} infrastructure errors)" if infra else ""))
    return point


def distill(a, client, out: Path, tok, model) -> None:
    import torch
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    t = time.monotonic()
    samples = run_job(client, job(a, a.tasks / "train.jsonl", TEACHER, [], samples=1))
    solved = sum(1 for s in samples if s.get("resolved"))
    log(f"teacher: {solved}/{len(samples)} training tasks solved through mini-swe-agent "
        f"({time.monotonic() - t:.0f} s)")
    ds_dir = out / "sft"
    subprocess.run([str(a.bin), "export", "sft", "--shards", str(out / "shards"), "--out", str(ds_dir),
                    "--route", TEACHER, "--min-reward", "1"], check=True, stdout=subprocess.DEVNULL)
    ds = load_dataset("parquet", data_files=str(ds_dir / "sft_tokens.parquet"))["train"]
    log(f"export sft: {len(ds)} token-exact demonstrations ({ds_dir / 'sft_tokens.parquet'})")
    t = time.monotonic()
    trainer = SFTTrainer(
        model=model, processing_class=tok,
        train_dataset=ds.select_columns(["input_ids", "assistant_masks"]),
        args=SFTConfig(output_dir=str(out / "sft-run"), num_train_epochs=a.sft_epochs, learning_rate=a.sft_lr,
                       per_device_train_batch_size=4, report_to="none", use_cpu=not torch.cuda.is_available(),
                       save_strategy="no", logging_steps=10, seed=a.seed, disable_tqdm=True),
    )
    trainer.train()
    log(f"SFT: {a.sft_epochs} epochs over {len(ds)} demonstrations in {time.monotonic() - t:.0f} s")
    path = out / "weights" / "sft"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    client.load(str(path.resolve()), policy_version=1, route=ROUTE)
    log(f"SFT weights loaded into route {ROUTE} as policy version 1")


def grpo(a, client, url: str, admin: str, out: Path, tok, model, curve: list) -> None:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rollcall_data.trl import Online

    online = Online(url, job(a, a.tasks / "train.jsonl", ROUTE, SAMPLED), key=admin, route=ROUTE,
                    first_version=1)

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            rows = online.steps[-1]["rows"]
            mean = sum(rows["reward"]) / len(rows["reward"])
            log(f"GRPO step {state.global_step}: mean training reward {mean:.2f} over {len(rows['reward'])} rollouts")
            curve.append(evaluate(a, client, online.first_version + state.global_step,
                                  f"GRPO step {state.global_step}"))

    trainer = GRPOTrainer(
        model=model, processing_class=tok, reward_funcs=online.reward, train_dataset=online.prompts(),
        rollout_func=online.rollout_func, callbacks=[online.callback(), Evaluate()],
        args=GRPOConfig(output_dir=str(out / "grpo-run"), num_generations=a.group, per_device_train_batch_size=
                        a.group * a.grpo_tasks, max_steps=a.grpo_steps, learning_rate=a.grpo_lr, report_to="none",
                        use_cpu=not torch.cuda.is_available(), logging_steps=1, save_strategy="no", seed=a.seed,
                        disable_tqdm=True),
    )
    trainer.train()


def plot(curve: list, path: Path, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["policy_version"] for p in curve]
    ys = [100 * p["resolved_at_1"] for p in curve]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.plot(xs, ys, marker="o", color="#2a6fdb")
    for p, x, y in zip(curve, xs, ys):
        ax.annotate(f"{p['resolved']}/{p['tasks']}", (x, y), textcoords="offset points", xytext=(0, 7),
                    ha="center", fontsize=8)
    ax.axvspan(-0.3, 0.3, color="#eeeeee")
    ax.set_xticks(xs, ["base" if x == 0 else ("SFT" if x == 1 else f"RL {x - 1}") for x in xs])
    ax.set_ylim(0, 105)
    ax.set_ylabel("held-out resolved@1 (%)")
    ax.set_xlabel("policy version (training phase)")
    ax.set_title(f"SmolLM2-135M in mini-swe-agent, learn family seed {seed}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description="make learn: baseline, distillation, GRPO, held-out curve")
    ap.add_argument("--bin", type=Path, default=ROOT / "target/release/rollcall")
    ap.add_argument("--harness-dir", type=Path, required=True)
    ap.add_argument("--model-file", type=Path, required=True, help="the shipped GGUF (rollcall model fetch)")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000,
                    help="the task family's split (default: a fresh one)")
    ap.add_argument("--out", type=Path, default=Path("learn-out"))
    ap.add_argument("--train", type=int, default=80)
    ap.add_argument("--heldout", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sft-epochs", type=float, default=2)
    ap.add_argument("--sft-lr", type=float, default=1e-4)
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--grpo-tasks", type=int, default=2, help="tasks per GRPO step")
    ap.add_argument("--group", type=int, default=8, help="rollouts per task in a GRPO group")
    ap.add_argument("--grpo-lr", type=float, default=2e-6)
    a = ap.parse_args()
    if not a.model_file.exists():
        sys.exit(f"learn: {a.model_file} is missing: run `rollcall model fetch` (make learn does)")
    out = a.out.resolve()
    if (out / "shards").exists():
        sys.exit(f"learn: {out} holds an earlier run: remove it or give --out")
    out.mkdir(parents=True, exist_ok=True)
    a.tasks = out / "tasks"
    log(f"seed {a.seed}: generating {a.train} training and {a.heldout} held-out tasks")
    subprocess.run([sys.executable, str(ROOT / "fixtures/tasks/learn/generate"), "--seed", str(a.seed),
                    "--out", str(a.tasks), "--train", str(a.train), "--heldout", str(a.heldout)], check=True)

    sys.path.insert(0, str(ROOT / "python"))
    from rollcall_data.jobs import Client
    from rollcall_data.models import from_gguf

    tok, model = from_gguf(a.model_file)
    teacher = Teacher(tok, json.loads((a.tasks / "gold.json").read_text()))
    threading.Thread(target=teacher.serve_forever, daemon=True).start()
    admin = secrets.token_hex(16)
    proc, url = serve(a, teacher, out, admin)
    client = Client(url, key=admin, timeout=300)
    curve: list[dict] = []
    try:
        log(f"rollcall serve on {url}, shards in {out / 'shards'}")
        curve.append(evaluate(a, client, 0, "baseline"))
        distill(a, client, out, tok, model)
        curve.append(evaluate(a, client, 1, "after SFT"))
        if a.grpo_steps:
            grpo(a, client, url, admin, out, tok, model, curve)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        teacher.shutdown()
        (out / "curve.json").write_text(json.dumps({"seed": a.seed, "curve": curve}, indent=1) + "\n")
    plot(curve, out / "learn-curve.png", a.seed)
    print("\nheld-out resolved@1 (greedy, one rollout per task):")
    print(f"  {'version':>7}  {'phase':<14} {'resolved':>9}  {'rate':>6}")
    for p in curve:
        print(f"  {p['policy_version']:>7}  {p['phase']:<14} {p['resolved']:>4}/{p['tasks']:<4}"
              f"  {100 * p['resolved_at_1']:5.1f}%")
    base, sft, last = curve[0], curve[1], curve[-1]
    print(f"\ndistillation: {100 * (sft['resolved_at_1'] - base['resolved_at_1']):+.1f} points; "
          f"RL: {100 * (last['resolved_at_1'] - sft['resolved_at_1']):+.1f} points after SFT")
    print(f"plot: {out / 'learn-curve.png'}; figures: {out / 'curve.json'}; total {time.monotonic() - T0:.0f} s")
    print(f"the same curve from the shards: {a.bin} view --shards {out / 'shards'}  "
          "(filter the rollouts to `heldout`; plot 'resolved by policy version')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
