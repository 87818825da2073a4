"""A client of `rollcall serve`'s job API (`/v1/jobs`, docs/jobs.md) and of
its weight loading (`POST /v1/admin/load`), with the standard library only:
what every trainer adapter in this package builds on.

    client = Client("http://127.0.0.1:8700")           # key: ROLLCALL_ADMIN_KEY
    job = client.submit({"tasks": "tasks.jsonl", "harness": "mini-swe-agent", "samples": 4})
    for group in client.groups(job):                    # as they finish, then the end
        ...
    client.load("/ckpt/step-1", policy_version=1)       # the next job samples from these
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator


class JobError(RuntimeError):
    """The job API refused a call, or a job failed; the message is rollcall's."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class Client:
    """One rollcall server. `key` (default: `ROLLCALL_ADMIN_KEY`) is sent as
    a bearer token: an admin key where the server has admin keys (the job
    API and weight loading need one then), else a client key or nothing."""

    def __init__(self, url: str, key: str | None = None, timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.key = key if key is not None else os.environ.get("ROLLCALL_ADMIN_KEY")
        self.timeout = timeout

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)["error"]
                raise JobError(f"{method} {path}: {e.code}: {err.get('message')}", e.code, err.get("code")) from None
            except (ValueError, KeyError, TypeError):
                raise JobError(f"{method} {path}: {e.code}: {raw[:500]!r}", e.code) from None

    # ------------------------------------------------------------ jobs

    def submit(self, job: dict) -> str:
        """Submit a job; returns its id. A refused job raises JobError."""
        return self.call("POST", "/v1/jobs", job)["id"]

    def status(self, job: str) -> dict:
        return self.call("GET", f"/v1/jobs/{job}")

    def cancel(self, job: str) -> dict:
        return self.call("DELETE", f"/v1/jobs/{job}", timeout=max(self.timeout, 150.0))

    def page(self, job: str, after: int = 0, limit: int = 64, max_staleness: int | None = None,
             wait: float = 0.0) -> dict:
        """One answer of `GET /v1/jobs/{id}/groups`."""
        q = f"after={after}&limit={limit}&wait={wait}"
        if max_staleness is not None:
            q += f"&max_staleness={max_staleness}"
        return self.call("GET", f"/v1/jobs/{job}/groups?{q}", timeout=wait + self.timeout)

    def groups(self, job: str, after: int = 0, max_staleness: int | None = None,
               poll: float = 20.0, deadline: float | None = None) -> Iterator[dict]:
        """Every group of `job` after cursor `after`, as it finishes, until the
        job has ended and all are delivered. Raises JobError if the job
        failed, or when `deadline` (seconds) passes first."""
        end = None if deadline is None else time.monotonic() + deadline
        cursor = after
        while True:
            page = self.page(job, after=cursor, max_staleness=max_staleness, wait=poll)
            yield from page["groups"]
            cursor = page["cursor"]
            if page["done"] and not page["groups"]:
                if page["state"] == "failed":
                    raise JobError(f"job {job} failed: {self.status(job).get('error')}")
                return
            if end is not None and time.monotonic() > end:
                raise JobError(f"job {job}: no end within {deadline} s (cursor {cursor})")

    # ------------------------------------------------------------ weights

    def routes(self) -> dict:
        return self.call("GET", "/v1/admin/status")["routes"]

    def load(self, model_path: str, policy_version: int, route: str | None = None) -> dict:
        """Put the checkpoint at `model_path` on `route` (default: the server's
        only route) under `policy_version`: calls after it sample from it."""
        if route is None:
            names = list(self.routes())
            if len(names) != 1:
                raise JobError(f"the server has routes {names}: say which one to load")
            route = names[0]
        return self.call("POST", "/v1/admin/load",
                         {"route": route, "model_path": str(model_path), "policy_version": int(policy_version)},
                         timeout=max(self.timeout, 600.0))
