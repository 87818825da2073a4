"""Hot weight reload of an embedded route, through the proxy's
`POST /v1/admin/load`, wired to the pause and resume of weight sync.

The new weights are a Hugging Face checkpoint directory that
`transformers` wrote: the shipped GGUF model, loaded by transformers,
perturbed by seeded noise (so that its answers differ) and saved with
`save_pretrained`. What rollcall generates from that directory must be what
transformers generates from it, to the token, and the rows must carry the
policy version each call ran under. A tokenizer change is refused unless
forced.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch  # noqa: E402  required, never skipped: make test installs it
import transformers  # noqa: E402

import rollcall_harness as h
from test_weight_sync import ADMIN, CLIENT, admin, chat, in_thread, wait_held

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def trained(gguf, tmp_path_factory):
    """A checkpoint directory as a trainer writes it, and transformers'
    greedy answer (token ids) from it."""
    out = tmp_path_factory.mktemp("checkpoint") / "step-1"
    tok, model = h.plain_model_from_gguf(gguf)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.1)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tok2 = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = tok2.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    with torch.no_grad():
        gen = reloaded.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                eos_token_id=tok2.eos_token_id, pad_token_id=tok2.eos_token_id)
    return out, gen[0, len(ids):].tolist()


def toml(model) -> str:
    return f"""
[server]
admin_keys_env = "TEST_ADMIN_KEYS"
client_keys_env = "TEST_CLIENT_KEYS"
[shards]
max_age_secs = 0.2
[[routes]]
name = "smol"
kind = "embedded"
[routes.embedded]
model_file = "{model}"
default_max_tokens = 24
default_temperature = 0.0
"""


def answer(r: h.RawResponse) -> str:
    assert r.status == 200, r.body
    return r.json()["choices"][0]["message"]["content"]


def ask(base: str, rollout: str) -> h.RawResponse:
    return chat(base, rollout, QUESTION[0]["content"], model="smol")


def test_a_checkpoint_directory_replaces_the_weights_of_a_running_route(tmp_path, gguf, trained):
    directory, theirs = trained
    p = h.start_proxy(tmp_path, "unused", toml=toml(gguf),
                      env={"TEST_ADMIN_KEYS": ADMIN, "TEST_CLIENT_KEYS": CLIENT})
    try:
        before = answer(ask(p.url, "a-before"))
        assert before == "The capital of France is Paris."

        # The trainer's own pause, load, resume: the held call runs on the
        # new weights.
        assert admin(p.url, "POST", "/v1/admin/pause", {"mode": "hold", "route": "smol"}).status == 200
        t, held = in_thread(ask, p.url, "b-held")
        wait_held(p.url, 1)
        r = admin(p.url, "POST", "/v1/admin/load", {"route": "smol", "model_path": str(directory)})
        assert r.status == 200, r.body
        loaded = r.json()["loaded"]
        assert len(loaded) == 1 and loaded[0]["success"], loaded
        assert r.json()["routes"]["smol"]["paused"] == "hold"  # the trainer resumes
        assert admin(p.url, "POST", "/v1/admin/resume", {"route": "smol", "policy_version": 1}).status == 200
        t.join(120)
        after = answer(held["r"])
        assert after != before

        # A load on an open gate pauses, loads and resumes by itself: back
        # to the GGUF file, policy version 2.
        r = admin(p.url, "POST", "/v1/admin/load",
                  {"route": "smol", "model_path": str(gguf), "policy_version": 2})
        assert r.status == 200, r.body
        assert r.json()["routes"]["smol"] == {**r.json()["routes"]["smol"], "paused": None, "policy_version": 2}
        assert answer(ask(p.url, "c-back")) == before

        # Failures leave the weights and the version as they were.
        r = admin(p.url, "POST", "/v1/admin/load",
                  {"route": "smol", "model_path": str(tmp_path / "nowhere"), "policy_version": 3})
        assert r.status == 502, r.body
        assert "cannot read" in r.json()["loaded"][0]["answer"]["message"]
        changed = tmp_path / "new-template"
        shutil.copytree(directory, changed)
        template = changed / "chat_template.jinja"
        if template.exists():
            template.write_text(template.read_text() + " ")
        else:
            cfg = json.loads((changed / "tokenizer_config.json").read_text())
            cfg["chat_template"] += " "
            (changed / "tokenizer_config.json").write_text(json.dumps(cfg))
        r = admin(p.url, "POST", "/v1/admin/load",
                  {"route": "smol", "model_path": str(changed), "policy_version": 3})
        assert r.status == 502, r.body
        message = r.json()["loaded"][0]["answer"]["message"]
        assert "tokenizer differs" in message and "chat template" in message and "force" in message, message
        assert r.json()["routes"]["smol"]["policy_version"] == 2
        assert admin(p.url, "POST", "/v1/admin/load",
                     {"route": "smol", "model_path": str(directory), "policy_version": 3},
                     key=CLIENT).status == 401
        assert answer(ask(p.url, "d-still")) == before
        r = admin(p.url, "POST", "/v1/admin/load",
                  {"route": "smol", "model_path": str(changed), "policy_version": 3, "force": True})
        assert r.status == 200, r.body
        assert "chat template" in r.json()["loaded"][0]["answer"]["message"]
        h.wait_for_shards(p.url)
    finally:
        p.terminate()
    rows = {r["rollout_id"]: r for r in h.duck_dicts(
        p.shards, "SELECT rollout_id, policy_version, completion_token_ids FROM t")}
    assert {k: v["policy_version"] for k, v in rows.items()} == {
        "a-before": 0, "b-held": 1, "c-back": 2, "d-still": 2}
    # What transformers generates from the directory, to the token.
    assert rows["b-held"]["completion_token_ids"] == theirs
