"""`rollcall view` (issue 18, in progress): the rollouts list served over
real HTTP on loopback from shards the proxy recorded, filtered, sorted and
paged on the server, its HTML escaped. (The browser tests come with the
rest of the pages.)"""

from __future__ import annotations

import json

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

        for bad, why in [("/api/rollouts?min_reward=high", "is not a number"),
                         ("/api/rollouts?sort=colour", "no column")]:
            r = h.raw_request(view.url, "GET", bad)
            assert r.status == 400 and why in r.json()["error"]["message"], r.body
        assert h.raw_request(view.url, "GET", "/nope").status == 404
    finally:
        view.kill()
