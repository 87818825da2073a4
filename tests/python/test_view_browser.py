"""`rollcall view` in a real browser (issue 18's acceptance): headless
Chromium (Debian's `chromium`, driven through Debian's `chromedriver` by
Selenium; `make browser` installs both) against shards recorded from real
harness runs:

- every harness's captured exchange (fixtures/<name>/exchange.jsonl)
  replayed through a real proxy as it is in test_fixtures.py, one rollout
  per harness, finished with a status, a reward and the metadata
  `rollcall batch` writes (group, harness, model patch, SWE-bench grading
  report, Balanced Adaptive Rollout's verdict);
- a real `rollcall batch` of two shipped tasks x two samples (mini-swe-agent,
  a Docker container per rollout, graded), recorded by a proxy whose route
  is of kind `vllm`, so that its calls carry the scripted model's token ids
  and logprobs.

The browser opens the list, filters it by status, by reward and by text in
the messages, opens rollouts (tool calls, tool results, final answer, patch
and grading report, raw JSON), the token view and the groups. Each step saves a screenshot under
`$ROLLCALL_ARTIFACTS` (default: pytest's temporary directory; the path is
printed) and checks that the browser logged no console error.

`ROLLCALL_SCREENSHOTS=DIR` also saves the README's screenshots of each page
(list.png, rollout.png, tokens.png, group.png; docs/viewer/ in the
repository) from the same run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from urllib.parse import quote

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

import rollcall_harness as h
from test_batch import SUBMIT, apply_b64, family, finishes, run_batch, scripted, write_tasks  # noqa: F401 (family: a fixture)
from test_fixtures import NAMES, Replay, load, send, tool_names

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1280, 900

# The captured task: every harness ran this command and then answered.
COMMAND_OUTPUT = "rollcall-42"
FINAL_TEXT = "Done. The command printed"
FIXTURE_GROUP = "replay.echo-proof"
F2P_TEST = "tests/test_proof.py::test_proof_file_holds_the_answer"
P2P_TEST = "tests/test_proof.py::test_readme_is_untouched"
PROOF_PATCH = """diff --git a/proof.txt b/proof.txt
new file mode 100644
index 0000000..5d4a4b8
--- /dev/null
+++ b/proof.txt
@@ -0,0 +1 @@
+rollcall-42
"""

# How each harness's replayed rollout is finished: status, reward, and
# Balanced Adaptive Rollout's verdict where it has one.
OUTCOMES = {
    "claude-code": ("completed", 1.0, True),
    "codex": ("completed", 1.0, True),
    "mini-swe-agent": ("completed", 0.0, False),
    "openclaw": ("completed", 0.0, None),
    "opencode": ("completed", 1.0, None),
    "zeroclaw": ("timeout", 0.0, None),
}

# The batch's proxy: one route, of kind vllm (token ids and logprobs).
VLLM_TOML = """
[shards]
max_age_secs = 0.2
[[routes]]
name = "policy"
url = "{upstream}/v1"
kind = "vllm"
"""
BATCH = "vb"


def grade_report(task: str, resolved: bool) -> dict:
    """`rollcall grade`'s JSON for one instance, as `rollcall batch` puts it
    in a rollout's metadata (`report`; src/grade/report.rs, `Grade`)."""
    f2p = {"success": [F2P_TEST], "failure": []} if resolved else {"success": [], "failure": [F2P_TEST]}
    return {
        "instance_id": task,
        "status_map": {F2P_TEST: "PASSED" if resolved else "FAILED", P2P_TEST: "PASSED"},
        "patch_successfully_applied": True,
        "report": {
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": {"success": [P2P_TEST], "failure": []},
            "FAIL_TO_FAIL": {"success": [], "failure": []},
            "PASS_TO_FAIL": {"success": [], "failure": []},
        },
        "resolution": "RESOLVED_FULL" if resolved else "RESOLVED_NO",
        "resolved": resolved,
        "error": None,
    }


def swebench_report(task: str, resolved: bool) -> dict:
    """The same in swebench's own report.json shape
    (`{instance_id: {resolved, tests_status}}`), as other graders leave it."""
    g = grade_report(task, resolved)
    return {task: {"patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True,
                   "resolved": resolved, "tests_status": g["report"]}}


def report_shape(harness: str) -> str:
    """Which shape a replayed rollout's report takes: swebench's for one
    harness, `rollcall batch`'s (rollcall grade's JSON) for the others."""
    return "swebench" if harness == "opencode" else "rollcall grade"


def replay_fixtures(shards: Path, work: Path) -> dict[str, list[dict]]:
    """Every harness's captured exchange through one real proxy (the replay
    server answers them in order), each harness's calls tagged as one
    rollout and finished as OUTCOMES says. Returns the exchanges by rollout."""
    names = [n for n in NAMES if n in OUTCOMES]
    assert set(names) == set(OUTCOMES), NAMES
    by_rollout = {f"replay-{n}": load(n) for n in names}
    replay = Replay([e for ex in by_rollout.values() for e in ex])
    proxy = h.start_proxy(work, replay.url, toml=h.TWO_ROUTES_TOML.format(upstream=replay.url), shards=shards)
    try:
        for rollout, exchanges in by_rollout.items():
            for e in exchanges:
                assert send(proxy.url, rollout, e) == (e["status"], e["response"].encode())
        for i, (rollout, _) in enumerate(by_rollout.items()):
            name = rollout.removeprefix("replay-")
            status, reward, kept = OUTCOMES[name]
            resolved = reward == 1.0
            meta = {
                "harness": name, "task": "echo-proof", "group": FIXTURE_GROUP, "sample": i, "attempt": 0,
                "model": "scripted", "model_patch": PROOF_PATCH if resolved else "",
                "report": (swebench_report if report_shape(name) == "swebench" else grade_report)("echo-proof", resolved),
                "resolution": "RESOLVED_FULL" if resolved else "RESOLVED_NO", "resolved": resolved,
            }
            if kept is not None:
                meta["bar"] = {"kept": kept, "why": "kept" if kept else "surplus_negative", "group_positives": 1,
                               "relaxed": False, "group_dropped": None, "n": 2, "n_max": 6}
            r = h.post_json(proxy.url, f"/v1/rollouts/{rollout}/finish",
                            {"status": status, "reward": reward, "metadata": meta})
            assert r.status == 200, r.body
        h.wait_for_shards(proxy.url)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
        replay.close()
    return by_rollout


def run_batch_on(shards: Path, work: Path, upstream: str, family: list[dict]) -> list[dict]:
    """`rollcall batch`, two tasks x two samples, mini-swe-agent on the host
    and each task in its container, through a proxy whose route is of kind
    vllm: the first task gets its gold fix, the second nothing."""
    solve, fail = family[0], family[1]
    work.mkdir(parents=True, exist_ok=True)
    tasks = write_tasks(work / "tasks.jsonl", [scripted(solve, [apply_b64(solve["patch"]), SUBMIT]),
                                               scripted(fail, [SUBMIT])])
    proxy = h.start_proxy(work, upstream, toml=VLLM_TOML.format(upstream=upstream), shards=shards, name="batch-proxy")
    try:
        cmd = [h.rollcall_bin(), "batch", "--tasks", str(tasks), "--harness", "mini-swe-agent",
               "--model", "scripted", "--shards", str(shards), "--proxy", proxy.url, "--out", str(work / "out"),
               "--name", BATCH, "--samples", "2", "--concurrency", "2", "--timeout", "300",
               "--grade-timeout", "300"]
        run_batch(cmd)
        h.wait_for_shards(proxy.url)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    return [solve, fail]


@pytest.fixture(scope="module")
def recorded(family, upstream, tmp_path_factory) -> dict:
    """One shard directory holding both recordings, and what was recorded."""
    work = tmp_path_factory.mktemp("view-browser")
    shards = work / "shards"
    exchanges = replay_fixtures(shards, work / "replay")
    solve, fail = run_batch_on(shards, work / "batch", upstream, family)
    rows = finishes(shards)
    batch = {rid: r for rid, r in rows.items() if rid.startswith(BATCH + ".")}
    assert len(batch) == 4, sorted(rows)
    for rid, r in batch.items():
        fixed = r["metadata"]["task"] == solve["instance_id"]
        assert (r["status"], r["reward"]) == ("completed", 1.0 if fixed else 0.0), (rid, r)
    return {"shards": shards, "work": work, "rows": rows, "exchanges": exchanges, "batch": batch,
            "solved": solve["instance_id"], "failed": fail["instance_id"]}


@pytest.fixture(scope="module")
def view(recorded):
    """`rollcall view` on the shards, run from their parent directory with
    a relative path (which the pages show, as in the README's screenshots)."""
    work, shards = recorded["work"], recorded["shards"]
    cmd = f"cd {shlex.quote(str(work))} && exec {shlex.quote(h.rollcall_bin())} view" \
          f" --shards {shlex.quote(shards.name)} --listen 127.0.0.1:0"
    proc = h.Proc(["-c", cmd], "rollcall view listening on ", work / "view.stderr", bin="/bin/sh")
    yield proc.url
    assert proc.alive(), proc.stderr_text()[-4000:]
    proc.kill()


def gone(element) -> bool:
    """The element has left the page: stale, or (while Chrome swaps one
    document for the next) a node its inspector no longer finds, which
    chromedriver reports as an unknown error, not as a stale element."""
    try:
        element.is_enabled()
        return False
    except StaleElementReferenceException:
        return True
    except WebDriverException as e:
        if "does not belong to the document" in (e.msg or ""):
            return True
        raise


class Browser:
    """Headless Chromium: each step loads or clicks, waits for the page,
    saves a screenshot and fails on any console error."""

    def __init__(self, base: str, artifacts: Path, docs: Path | None):
        for path in (CHROMIUM, CHROMEDRIVER):
            if not os.access(path, os.X_OK):
                pytest.fail(f"{path} is missing: run `make browser` (Debian's chromium and chromium-driver)")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars"):
            opts.add_argument(a)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # The driver at a fixed path: Selenium Manager never downloads one.
        self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
        # The page itself WIDTH x HEIGHT (the window's size counts its frame).
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                    {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        self.base = base
        self.artifacts = artifacts
        self.docs = docs
        self.steps = 0

    def quit(self):
        self.driver.quit()

    def get(self, path: str, shot: str):
        self.driver.get(self.base + path)
        self.settle(shot)

    def click(self, element, shot: str, navigates: bool = True):
        """Click; when the click loads a page, wait until the old one is gone."""
        old = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        if navigates:
            WebDriverWait(self.driver, 30).until(lambda _: gone(old))
        self.settle(shot)

    def settle(self, shot: str):
        WebDriverWait(self.driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
        self.shot(shot)

    def shot(self, shot: str):
        self.steps += 1
        path = self.artifacts / f"{self.steps:02d}-{shot}.png"
        assert self.driver.save_screenshot(str(path)), path
        self.no_console_errors(shot)

    def doc_shot(self, name: str):
        """The README's screenshot of this page, when asked for."""
        if self.docs is not None:
            self.docs.mkdir(parents=True, exist_ok=True)
            assert self.driver.save_screenshot(str(self.docs / f"{name}.png"))

    def no_console_errors(self, step: str):
        logs = self.driver.get_log("browser")
        errors = [e for e in logs if e["level"] == "SEVERE"]
        assert errors == [], (f"console errors at step {self.steps:02d}-{step} ({self.driver.current_url};"
                              f" screenshots in {self.artifacts}): {errors}")

    def find(self, css: str):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str):
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def texts(self, css: str) -> list[str]:
        return [e.text for e in self.find_all(css)]

    def list_ids(self) -> list[str]:
        return self.texts("#rollouts tbody a.rollout")


@pytest.fixture(scope="module")
def browser(view, tmp_path_factory, request):
    env_dir = os.environ.get("ROLLCALL_ARTIFACTS")
    artifacts = Path(env_dir) if env_dir else tmp_path_factory.mktemp("view-screenshots")
    artifacts.mkdir(parents=True, exist_ok=True)
    docs = os.environ.get("ROLLCALL_SCREENSHOTS")
    where = f"==> rollcall view in the browser: screenshots in {artifacts}" + (f", the README's in {docs}" if docs else "")
    # On the terminal even while pytest captures the output.
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(where)
    else:
        print(where)
    b = Browser(view, artifacts, Path(docs) if docs else None)
    yield b
    b.quit()


def count_of(b: Browser) -> int:
    m = re.match(r"\s*(\d+) rollouts", b.find("#count").text)
    assert m, b.find("#count").text
    return int(m.group(1))


def test_the_list_filters_by_status_and_reward(recorded, browser):
    b, rows = browser, recorded["rows"]
    b.get("/", "list")
    assert sorted(b.list_ids()) == sorted(rows)
    assert count_of(b) == len(rows)
    b.doc_shot("list")

    # Filter by status through the form.
    Select(b.find("select[name=status]")).select_by_value("timeout")
    b.click(b.find("form button[type=submit]"), "list-status-timeout")
    want = sorted(rid for rid, r in rows.items() if r["status"] == "timeout")
    assert want == ["replay-zeroclaw"]
    assert sorted(b.list_ids()) == want and count_of(b) == len(want)
    assert "status=timeout" in b.driver.current_url

    # Then by reward, within completed rollouts.
    Select(b.find("select[name=status]")).select_by_value("completed")
    for name, value in (("min_reward", "0.5"), ("max_reward", "1")):
        field = b.find(f"input[name={name}]")
        field.clear()
        field.send_keys(value)
    b.click(b.find("form button[type=submit]"), "list-completed-reward-0.5-1")
    want = sorted(rid for rid, r in rows.items() if r["status"] == "completed" and 0.5 <= r["reward"] <= 1)
    assert len(want) == 3 + 2, want  # three replayed harnesses, the solved task's two samples
    assert sorted(b.list_ids()) == want and count_of(b) == len(want)
    # The filter stays in the form.
    assert b.find("input[name=min_reward]").get_attribute("value") == "0.5"

    # And only unrewarded ones.
    field = b.find("input[name=min_reward]")
    field.clear()
    field.send_keys("0")
    field = b.find("input[name=max_reward]")
    field.clear()
    field.send_keys("0")
    b.click(b.find("form button[type=submit]"), "list-completed-reward-0")
    want = sorted(rid for rid, r in rows.items() if r["status"] == "completed" and r["reward"] == 0)
    assert sorted(b.list_ids()) == want and count_of(b) == len(want)

    # A column's own filter: the harness column's text, the calls column's range.
    b.get("/", "list-before-column-filter")
    b.find("input[name='f.harness']").send_keys("mini-swe")
    b.find("input[name='f.calls']").send_keys("2..")
    b.click(b.find("form button[type=submit]"), "list-column-filter")
    calls = dict(h.duck(recorded["shards"], "SELECT rollout_id, count(*) FROM t GROUP BY rollout_id"))
    want = sorted(rid for rid, r in rows.items()
                  if r["metadata"].get("harness") == "mini-swe-agent" and calls.get(rid, 0) >= 2)
    assert want and sorted(b.list_ids()) == want and count_of(b) == len(want), (want, b.list_ids())

    # Sort by reward, up then down, by its column header.
    b.get("/", "list-before-sort")
    for shot, desc in (("list-sort-reward", False), ("list-sort-reward-desc", True)):
        header = next(a for a in b.find_all("#rollouts thead a") if a.text.split()[0] == "reward")
        b.click(header, shot)
        got = [float(t.split()[0]) for t in b.texts("#rollouts tbody td.num:nth-child(6)")]
        assert len(got) == len(rows) and got == sorted((r["reward"] for r in rows.values()), reverse=desc), got

    # Full-text search over the messages, from a fresh list: the command's
    # output is in the replayed harnesses' histories only.
    b.get("/", "list-before-search")
    b.find("input[name=text]").send_keys(COMMAND_OUTPUT)
    b.click(b.find("form button[type=submit]"), "list-search-messages")
    want = sorted(r for r, in h.duck(recorded["shards"],
                                     f"SELECT DISTINCT rollout_id FROM t WHERE request LIKE '%{COMMAND_OUTPUT}%'"))
    assert want == sorted(recorded["exchanges"]), want
    assert sorted(b.list_ids()) == want and count_of(b) == len(want)


def expected_tools(exchanges: list[dict]) -> set[str]:
    return {name for e in exchanges for name in tool_names(e)}


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_a_replayed_rollout_shows_its_tool_calls_results_and_answer(recorded, browser, name):
    b = browser
    rollout = f"replay-{name}"
    exchanges = recorded["exchanges"][rollout]
    # From the list to the rollout, by its link.
    b.get("/", f"list-for-{name}")
    link = next(a for a in b.find_all("a.rollout") if a.text == rollout)
    b.click(link, f"rollout-{name}")
    assert rollout in b.find("h1").text
    assert len(b.find_all("table#timeline tr.call")) == len(exchanges)

    conv = b.find("section#conversation")
    assert conv.find_elements(By.CSS_SELECTOR, ".msg.user"), "the task is shown"
    assert conv.find_elements(By.CSS_SELECTOR, ".msg.assistant")
    # The tool calls, by name, with their arguments.
    calls = conv.find_elements(By.CSS_SELECTOR, ".tool-call")
    names = {c.find_element(By.CSS_SELECTOR, ".tool-name").text.strip() for c in calls}
    assert expected_tools(exchanges) <= names, (names, expected_tools(exchanges))
    args = " ".join(c.find_element(By.CSS_SELECTOR, "pre.arguments").text for c in calls)
    assert "6*7" in args, args
    # The tool results: the command's output.
    results = " ".join(e.text for e in conv.find_elements(By.CSS_SELECTOR, ".msg.tool"))
    assert COMMAND_OUTPUT in results, results
    # The final answer, where the harness's last call was answered in text.
    if not tool_names(exchanges[-1]):
        assert FINAL_TEXT in b.find("#final-answer").text

    assert b.find_all("section#segments")
    grade = b.find("section#grade")
    resolved = OUTCOMES[name][1] == 1.0
    if resolved:
        assert "+rollcall-42" in grade.find_element(By.CSS_SELECTOR, "pre.diff").text
    assert grade.find_elements(By.CSS_SELECTOR, "table#tests"), (
        f"no table#tests: the grading report's tests are not listed (metadata.report in {report_shape(name)}'s shape)")
    tests = grade.find_element(By.CSS_SELECTOR, "table#tests").text
    assert "FAIL_TO_PASS" in tests and "PASS_TO_PASS" in tests
    assert F2P_TEST in tests and P2P_TEST in tests
    rows = b.driver.execute_script(
        "return Array.from(document.querySelectorAll('table#tests tr')).map(r => r.innerText)")
    f2p_row = next(r for r in rows if F2P_TEST in r)
    assert ("fail" in f2p_row.lower().replace("fail_to_pass", "")) != resolved, f2p_row

    # A call's raw JSON, fetched when opened, with the key redacted.
    raw = b.find("details.raw")
    b.click(raw.find_element(By.TAG_NAME, "summary"), f"rollout-{name}-raw", navigates=False)
    pre = raw.find_element(By.CSS_SELECTOR, "pre.raw-json")
    WebDriverWait(b.driver, 30).until(lambda d: pre.text.strip().startswith("{"))
    got = json.loads(pre.text)
    assert got["request"]["model"] == json.loads(exchanges[0]["request"])["model"], pre.text[:2000]
    assert got["response_raw"] and "sk-replay" not in pre.text
    b.shot(f"rollout-{name}-raw-loaded")

    # The token view opens, and says so, though a replayed fixture has no
    # token ids (its routes are not of a kind that captures them).
    b.get(f"/rollouts/{quote(rollout, safe='')}/tokens", f"tokens-{name}")
    assert b.find_all("#tokens") and not b.find_all("#tokens span.tok")


def solved_batch_rollout(recorded) -> str:
    return sorted(rid for rid, r in recorded["batch"].items() if r["reward"] == 1.0)[0]


def test_a_batch_rollout_shows_its_conversation_patch_and_grade(recorded, browser):
    b = browser
    rid = solved_batch_rollout(recorded)
    meta = recorded["batch"][rid]["metadata"]
    b.get("/rollouts/" + quote(rid, safe=""), "batch-rollout")
    assert rid in b.find("h1").text
    assert b.find_all("table#timeline tr.call")
    names = b.texts("section#conversation .tool-call .tool-name")
    assert names, "mini-swe-agent ran the task's commands through tool calls"
    assert any("git apply" in t for t in b.texts("section#conversation .tool-call pre.arguments"))
    assert b.find_all("section#conversation .msg.tool")
    b.doc_shot("rollout")
    grade = b.find("section#grade")
    diff = grade.find_element(By.CSS_SELECTOR, "pre.diff").text
    assert diff.strip() and diff.splitlines()[0] in meta["model_patch"], diff[:500]
    # The grading report `rollcall batch` wrote: every test with its status.
    assert grade.find_elements(By.CSS_SELECTOR, "table#tests"), (
        "no table#tests: the grading report's tests are not listed (metadata.report as `rollcall batch` writes it:"
        f" rollcall grade's JSON, keys {sorted(meta['report'])})")
    tests = grade.find_element(By.CSS_SELECTOR, "table#tests")
    report = meta["report"]["report"]
    # Every row's text in one round trip (a task can list hundreds of tests).
    texts = b.driver.execute_script("return Array.from(arguments[0].rows).map(r => r.innerText)", tests)
    for lst in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for t in report[lst]["success"]:
            row = next((r for r in texts if t in r), None)
            assert row is not None and lst in row and "fail" not in row.lower().replace("fail_to_pass", ""), (t, row)


def test_the_token_view_shades_a_batch_rollouts_tokens(recorded, browser):
    b = browser
    rid = solved_batch_rollout(recorded)
    b.get("/rollouts/" + quote(rid, safe=""), "batch-rollout-for-tokens")
    b.click(b.find("a#tokens-link"), "batch-tokens")
    assert rid in b.find("h1").text
    toks = b.find_all("#tokens span.tok")
    assert toks, "the vllm route's calls carry token ids"
    titles = [t.get_attribute("title") or "" for t in toks[:50]]
    assert all(re.search(r"\d", t) for t in titles), titles  # the id
    assert any(re.search(r"-?\d+\.\d+", t) for t in titles), titles  # a logprob
    assert "".join(t.text for t in toks[:50]).strip(), "the sampled tokens' text is shown"
    assert b.find_all(".legend")
    b.doc_shot("tokens")


def test_groups_show_their_samples_side_by_side(recorded, browser):
    b, rows = browser, recorded["rows"]
    for group, shot in ((FIXTURE_GROUP, "group-replayed"), (f"{BATCH}.{recorded['solved']}", "group-batch")):
        members = sorted(rid for rid, r in rows.items() if r["metadata"].get("group") == group)
        assert members
        # From the list, through the group's link.
        b.get("/", f"list-for-{shot}")
        link = next(a for a in b.find_all("a.group") if a.text == group)
        b.click(link, shot)
        assert group in b.find("h1").text
        table = b.find("table#samples").text
        for rid in members:
            assert rid in table, (rid, table)
        assert b.find_all("#divergence")
        if group == FIXTURE_GROUP:
            assert "kept" in b.find("body").text.lower()
            b.doc_shot("group")
