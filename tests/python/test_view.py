"""`rollcall view` (issue 18, in progress): the rollouts list served over
real HTTP on loopback from shards the proxy recorded, filtered, sorted and
paged on the server, its HTML escaped; full-text search over the calls'
messages; the plots over the filtered rollouts; and the viewer inside
`rollcall serve --view` (and a `rollcall view` beside a proxy) showing calls
published after it started. (The browser tests are in
test_view_browser.py.)"""

from __future__ import annotations

import json
import time

import rollcall_harness as h


def test_the_rollouts_list_is_filtered_sorted_and_paged_on_the_server(make_proxy, tmp_path):
    p = make_proxy()
    for i in range(60):
        rid = f"v-{i:02d}"
        r = h.post_json(p.url, f"/rollouts/{rid}/v1/chat/completions",
                        {"model": "scripted", "messages": [{"role": "user", "content": f"task {i}"}]})
        assert r.status == 200, r.body
        if i < 55:
            harness = "<script>alert(1)</script>" if i == 7 else "mini-swe-agent"
            body = {"status": "completed" if i % 2 == 0 else "timeout", "reward": i / 100,
                    "metadata": {"harness": harness, "group": f"task-{i % 6}"}}
            assert h.post_json(p.url, f"/v1/rollouts/{rid}/finish", body).status == 200
    h.wait_for_shards(p.url)
    p.terminate()

    view = h.Proc(["view", "--shards", str(p.shards), "--listen", "127.0.0.1:0"], "rollcall view listening on ",
                  tmp_path / "view.stderr")
    try:
        page = h.raw_request(view.url, "GET", "/")
        assert page.status == 200 and page.headers["content-type"].startswith("text/html")
        html = page.body.decode()
        assert "60 rollouts" in html and "v-00" in html and 'id="next"' in html
        assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
        assert "prefers-color-scheme: dark" in html

        api = h.raw_request(view.url, "GET", "/api/rollouts?status=completed&min_reward=0.3&sort=reward&desc=1")
        assert api.status == 200, api.body
        got = api.json()
        want = sorted((i for i in range(55) if i % 2 == 0 and i / 100 >= 0.3), reverse=True)
        assert got["total"] == len(want)
        assert [r["rollout_id"] for r in got["rows"]] == [f"v-{i:02d}" for i in want]
        assert all(r["calls"] == 1 and r["status"] == "completed" for r in got["rows"])

        second = h.raw_request(view.url, "GET", "/api/rollouts?page=1").json()
        assert second["total"] == 60 and second["offset"] == 50
        assert [r["rollout_id"] for r in second["rows"]] == [f"v-{i:02d}" for i in range(50, 60)]
        unfinished = h.raw_request(view.url, "GET", "/api/rollouts?status=unfinished").json()
        assert {r["rollout_id"] for r in unfinished["rows"]} == {f"v-{i:02d}" for i in range(55, 60)}
        text = h.raw_request(view.url, "GET", "/api/rollouts?q=TASK-5").json()
        assert text["total"] == len([i for i in range(55) if i % 6 == 5])

        # Full-text search over the messages and answers (the scripted
        # upstream answers "Reply to: <the user's text>"), ignoring case,
        # with the other filters, paged from the cached answer.
        found = h.raw_request(view.url, "GET", "/api/rollouts?text=REPLY%20TO:%20TASK%205").json()
        assert sorted(r["rollout_id"] for r in found["rows"]) == [f"v-{i:02d}" for i in [5, *range(50, 60)]]
        both = h.raw_request(view.url, "GET", "/api/rollouts?text=reply+to:+task+5&status=completed").json()
        assert [r["rollout_id"] for r in both["rows"]] == ["v-50", "v-52", "v-54"]
        assert h.raw_request(view.url, "GET", "/api/rollouts?text=task%205&page=1").json()["rows"] == []
        assert h.raw_request(view.url, "GET", "/api/rollouts?text=no+such+words").json()["total"] == 0
        searched = h.raw_request(view.url, "GET", "/?text=%3Cb%3Etask+1").body.decode()
        assert 'name="text"' in searched and 'value="&lt;b&gt;task 1"' in searched and "0 rollouts of 60" in searched

        # The plots, over the rollouts that pass the filter.
        for plot in ("plot-reward", "plot-passk", "plot-calls"):
            assert f'<figure id="{plot}"><svg' in html, plot
        assert 'class="bar"' in html
        assert "reward: 55 rollouts (5 without a reward)" in html
        assert "pass@9 per task" in html and "over 6 tasks" in html  # task-0 has 10, the others 9
        assert "calls per rollout: 60 rollouts" in html
        done = h.raw_request(view.url, "GET", "/?status=completed").body.decode()
        assert "reward: 28 rollouts<" in done and "over 3 tasks" in done and "calls per rollout: 28 rollouts" in done

        # A filter on any column: text it contains, or a range of numbers.
        ids = [r["rollout_id"] for r in h.raw_request(view.url, "GET", "/api/rollouts?f.rollout_id=V-5").json()["rows"]]
        assert ids == [f"v-{i}" for i in range(50, 60)]
        ranged = h.raw_request(view.url, "GET", "/api/rollouts?f.reward=0.5..0.52&f.calls=1").json()
        assert [r["rollout_id"] for r in ranged["rows"]] == ["v-50", "v-51", "v-52"]
        page = h.raw_request(view.url, "GET", "/?f.harness=mini").body.decode()
        assert 'name="f.harness" value="mini"' in page

        for bad, why in [("/api/rollouts?min_reward=high", "is not a number"),
                         ("/api/rollouts?f.calls=lots", "is not a number"),
                         ("/api/rollouts?f.colour=red", "no column"),
                         ("/api/rollouts?sort=colour", "no column")]:
            r = h.raw_request(view.url, "GET", bad)
            assert r.status == 400 and why in r.json()["error"]["message"], r.body
        bad_page = h.raw_request(view.url, "GET", "/?min_reward=high")
        assert bad_page.status == 400 and bad_page.headers["content-type"].startswith("text/html")
        assert "is not a number" in bad_page.body.decode()
        assert h.raw_request(view.url, "GET", "/nope").status == 404
    finally:
        view.kill()


def _total(base: str, path: str = "/api/rollouts") -> dict:
    r = h.raw_request(base, "GET", path)
    assert r.status == 200, r.body
    return r.json()


def _wait_until(what: str, check, timeout: float = 60.0):
    """Poll `check` until it returns something true (a bound so that a
    failure ends, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout}s")
        time.sleep(0.1)


def test_serve_view_shows_calls_published_after_it_started(upstream, tmp_path):
    shards = tmp_path / "shards"
    cfg = tmp_path / "proxy.toml"
    cfg.write_text(h.DEFAULT_TOML)
    proxy = h.Proc(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0", "--shards", str(shards),
                    "--upstream", f"{upstream}/v1", "--view", "127.0.0.1:0"],
                   "rollcall listening on ", tmp_path / "proxy.stderr")
    beside = None
    try:
        line = proxy.popen.stdout.readline().decode()
        assert line.startswith("rollcall view listening on http://"), line
        view_url = line.strip()[len("rollcall view listening on "):].rstrip("/")
        assert _total(view_url)["total"] == 0
        assert "0 rollouts" in h.raw_request(view_url, "GET", "/").body.decode()
        # A `rollcall view` of the same directory, started before the call.
        beside = h.Proc(["view", "--shards", str(shards), "--listen", "127.0.0.1:0"],
                        "rollcall view listening on ", tmp_path / "view.stderr")

        r = h.post_json(proxy.url, "/rollouts/live-1/v1/chat/completions",
                        {"model": "scripted", "messages": [{"role": "user", "content": "arrived late"}]})
        assert r.status == 200, r.body
        h.wait_for_shards(proxy.url)
        for url in (view_url, beside.url):
            got = _wait_until("the new call in the list", lambda: _total(url)["rows"])
            assert [(x["rollout_id"], x["calls"], x["status"]) for x in got] == [("live-1", 1, None)]
            assert _total(url, "/api/rollouts?text=ARRIVED+LATE")["total"] == 1

        fin = {"status": "completed", "reward": 1.0, "metadata": {"task": "t"}}
        assert h.post_json(proxy.url, "/v1/rollouts/live-1/finish", fin).status == 200
        h.wait_for_shards(proxy.url)
        for url in (view_url, beside.url):
            rows = _wait_until("the finish in the list",
                               lambda: _total(url, "/api/rollouts?status=completed")["rows"])
            assert (rows[0]["rollout_id"], rows[0]["reward"], rows[0]["group"]) == ("live-1", 1.0, "t")
        page = h.raw_request(view_url, "GET", "/").body.decode()
        assert "pass@1 (light) and pass@1 per task: means 1.00 and 1.00 over 1 tasks" in page
    finally:
        if beside:
            beside.kill()
        proxy.kill()


def test_view_open_reports_a_browser_that_cannot_start_and_keeps_serving(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    view = h.Proc(["view", "--shards", str(shards), "--listen", "127.0.0.1:0", "--open"],
                  "rollcall view listening on ", tmp_path / "view.stderr",
                  env={"BROWSER": str(tmp_path / "no-such-browser")})
    try:
        assert h.raw_request(view.url, "GET", "/").status == 200
        _wait_until("the message on stderr", lambda: "could not open the browser" in view.stderr_text())
        assert view.alive()
    finally:
        view.kill()
