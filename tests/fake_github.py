"""A local stand-in for the GitHub REST API, for tests that use the real PyGithub.

A real `ThreadingHTTPServer` on 127.0.0.1 (random port) in a background thread, holding
repositories, branches, pull requests, issues, comments, reactions, labels and
collaborator permissions in memory, and answering with JSON shaped like GitHub's (enough
fields for PyGithub's objects).

Use it through the `fake_github` fixture, or as a context manager::

    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from fake_github import FakeGitHub

    pytest_plugins = ["fake_github"]  # registers the `fake_github` fixture

    def test_something(fake_github: FakeGitHub) -> None:
        gh = github.Github(auth=github.Auth.Token(fake_github.token),
                           base_url=fake_github.base_url, retry=None)
        ...

    with FakeGitHub(token="t") as server:
        ...

Seed state (every helper returns the stored JSON-like dict, which tests may read):

    server.add_repo("octo/kernels", default_branch="main", branches={"main": sha})
    server.add_repo("mallory/kernels", fork=True, parent="octo/kernels")
    server.add_branch("octo/kernels", "feature", sha)
    server.link_remote("octo/kernels", bare_repo_path)   # branches/SHAs read from real git
    pr = server.add_pull("octo/kernels", head="feature", base="main", body="...",
                         user="alice", head_repo="mallory/kernels")
    server.add_issue("octo/kernels", title="a plain issue")
    c = server.add_comment("octo/kernels", pr["number"], "/kfbot help", user="alice")
    server.set_permission("octo/kernels", "alice", "write")  # admin/maintain/write/triage/read/none

Read what happened:

    server.calls        # every request, in order: Call(method, path, query, json,
                        #   authorization, status)
    server.endpoints()  # ["GET /repos/octo/kernels", "POST /repos/octo/kernels/pulls", ...]
    server.pulls["octo/kernels"][1]["body"]; server.comments_on("octo/kernels", 1)
    server.reactions[comment_id]; server.issue_reactions[("octo/kernels", 1)]
    server.clear_calls()

Inject failures (answered before anything else, counted down, matched with
`re.fullmatch` against the path without its query string):

    server.fail_next("POST", r"/repos/octo/kernels/pulls", 422, body={...})
    server.fail_next("GET", r"/repos/.*", 403, times=2,
                     body={"message": "API rate limit exceeded for installation."},
                     headers={"Retry-After": "1", "x-ratelimit-remaining": "0"})

Behaviour worth knowing, copied from GitHub:

- A request without `Authorization: token <token>` (or `Bearer <token>`) gets 401
  ("Requires authentication", or "Bad credentials" for a wrong token).
- Creating a pull request when an open one exists for the same head and base is a 422
  "A pull request already exists for owner:branch."; a head branch that does not exist is
  a 422 on field `head`; a head at the same commit as the base is a 422 "No commits
  between ...".
- `GET .../collaborators/{user}/permission` answers 404 for a user never given a
  permission (`set_permission(..., "none")` makes a known user without access).
- With `link_remote`, branch SHAs, PR head/base SHAs and `GET .../pulls/{n}/commits`
  come from the bare repository at request time (branches seeded with `add_branch` are
  kept beside its real ones), `DELETE .../git/refs/heads/{b}` deletes the ref there, and
  an open pull request whose head branch no longer exists is closed (as GitHub closes a
  PR when its head branch is deleted).
- Lists are paginated with `per_page`/`page` and a `Link` header, as PyGithub expects.
- The Git Data API works on the linked bare repository: `GET .../git/commits/{sha}`,
  `.../git/trees/{sha}` (`?recursive=1`), `.../git/blobs/{sha}` (base64 in lines, as
  GitHub sends it); `POST .../git/blobs`, `.../git/trees` (entries on top of `base_tree`,
  nested paths made as trees, `content` made into a blob), `.../git/commits` (the token's
  login as author when none is given), `.../git/refs` (422 when the ref exists);
  `PATCH .../git/refs/heads/{b}` (422 "Update is not a fast forward" without `force`);
  and `GET .../compare/{base}...{head}`. Every object is a real git object there.

The server, its HTTP handling and the fixture are here; what it stores is in
fake_github_records.py, the JSON it renders in fake_github_render.py, and its endpoints
in fake_github_rest.py (REST, and the routing) and fake_github_git.py (Git Data).

PYTEST_DONT_REWRITE: the module holds no assertions, so a test may import it directly
and another name it in `pytest_plugins` without pytest warning that it came too late.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from fake_github_git import ROUTES as GIT_ROUTES
from fake_github_records import (
    JSON,
    NOW,
    ROLE_NAMES,
    Call,
    Failure,
    Reply,
    Repo,
    error_body,
)
from fake_github_render import Render
from fake_github_rest import ROUTES as REST_ROUTES
from fake_github_rest import Request


class FakeGitHub(ThreadingHTTPServer):
    """The fake GitHub server; see the module docstring for how to use it."""

    daemon_threads = True

    def __init__(self, token: str = "ghs_fakeTokenForTests0123456789",
                 login: str = "kfbot-app[bot]") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.token = token
        self.login = login
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"
        self.calls: list[Call] = []
        self.repos: dict[str, Repo] = {}
        self.pulls: dict[str, dict[int, JSON]] = {}
        self.issues: dict[str, dict[int, JSON]] = {}
        self.comments: dict[int, JSON] = {}
        self.reactions: dict[int, list[JSON]] = {}
        self.issue_reactions: dict[tuple[str, int], list[JSON]] = {}
        self.labels: dict[str, dict[str, JSON]] = {}
        self.permissions: dict[tuple[str, str], str] = {}
        self.failures: list[Failure] = []
        self.holds: list[tuple[str, str, threading.Event, threading.Event]] = []
        self.lock = threading.RLock()
        self._next_id = 1000
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment variables that point a client at this server."""
        return {"GITHUB_API_URL": self.base_url, "GITHUB_TOKEN": self.token}

    # -- seeding ---------------------------------------------------------------------------

    def new_id(self) -> int:
        with self.lock:
            self._next_id += 1
            return self._next_id

    def add_repo(self, full_name: str, default_branch: str = "main", fork: bool = False,
                 private: bool = False, parent: str | None = None,
                 branches: dict[str, str] | None = None) -> Repo:
        with self.lock:
            repo = Repo(full_name, self.new_id(), default_branch, fork, private, parent,
                         dict(branches or {}))
            self.repos[full_name] = repo
            self.pulls.setdefault(full_name, {})
            self.issues.setdefault(full_name, {})
            self.labels.setdefault(full_name, {})
            return repo

    def add_branch(self, full_name: str, name: str, sha: str) -> None:
        with self.lock:
            self.repos[full_name].branches[name] = sha

    def link_remote(self, full_name: str, bare_repo: str | Path) -> None:
        """Read this repository's branches from a real (bare) git repository."""
        with self.lock:
            self.repos[full_name].bare = Path(bare_repo)

    def set_permission(self, full_name: str, user: str, permission: str) -> None:
        if permission not in ROLE_NAMES:
            raise ValueError(f"unknown permission {permission!r}")
        with self.lock:
            self.permissions[(full_name, user)] = permission

    def add_issue(self, full_name: str, title: str = "An issue", body: str = "",
                  user: str = "alice", labels: tuple[str, ...] = ()) -> JSON:
        with self.lock:
            number = self.next_number(full_name)
            issue = {"number": number, "id": self.new_id(), "title": title, "body": body,
                     "user": user, "state": "open", "labels": list(labels),
                     "created_at": NOW, "updated_at": NOW, "closed_at": None}
            self.issues[full_name][number] = issue
            return issue

    def add_pull(self, full_name: str, head: str, base: str | None = None, title: str = "A change",
                 body: str = "", user: str = "alice", draft: bool = False,
                 head_repo: str | None = None, head_sha: str | None = None,
                 state: str = "open", labels: tuple[str, ...] = ()) -> JSON:
        """Add a pull request; `head_repo` names a fork (default: the same repository)."""
        with self.lock:
            repo = self.repos[full_name]
            source = head_repo or full_name
            sha = head_sha or self.branch_sha(self.repos[source], head) or "0" * 40
            number = self.next_number(full_name)
            pr = {"number": number, "id": self.new_id(), "title": title, "body": body,
                  "user": user, "state": state, "draft": draft, "head_ref": head,
                  "head_repo": source, "head_sha": sha, "base_ref": base or repo.default_branch,
                  "labels": list(labels), "created_at": NOW, "updated_at": NOW,
                  "closed_at": None, "commits": []}
            self.pulls[full_name][number] = pr
            return pr

    def add_comment(self, full_name: str, number: int, body: str, user: str = "alice",
                    user_type: str = "User", association: str = "CONTRIBUTOR") -> JSON:
        with self.lock:
            comment = {"id": self.new_id(), "repo": full_name, "issue": number, "body": body,
                       "user": user, "user_type": user_type, "association": association,
                       "created_at": NOW, "updated_at": NOW}
            self.comments[comment["id"]] = comment
            return comment

    def comments_on(self, full_name: str, number: int) -> list[JSON]:
        with self.lock:
            return [c for c in self.comments.values()
                    if c["repo"] == full_name and c["issue"] == number]

    def fail_next(self, method: str, path_regex: str, status: int, body: Any = None,
                  headers: dict[str, str] | None = None, times: int = 1) -> None:
        """Answer the next `times` matching requests with `status` (and body/headers)."""
        with self.lock:
            self.failures.append(Failure(method.upper(), path_regex, status,
                                         body if body is not None else error_body(status),
                                         dict(headers or {}), times))

    def hold_next(self, method: str, path_regex: str) -> tuple[threading.Event, threading.Event]:
        """Keep the next matching request waiting: (arrived, release). The test can look at
        the client while it waits for the answer, then set `release`."""
        arrived, release = threading.Event(), threading.Event()
        with self.lock:
            self.holds.append((method.upper(), path_regex, arrived, release))
        return arrived, release

    # -- reading what happened -------------------------------------------------------------

    def endpoints(self, with_query: bool = False) -> list[str]:
        """Every request as "METHOD /path" (with "?k=v&..." when `with_query`)."""
        with self.lock:
            calls = list(self.calls)
        if not with_query:
            return [str(c) for c in calls]
        return [f"{c}?{urllib.parse.urlencode(sorted(c.query.items()), safe=':/')}"
                if c.query else str(c)
                for c in calls]

    def clear_calls(self) -> None:
        with self.lock:
            self.calls.clear()

    # -- state helpers used by the handlers ------------------------------------------------

    def next_number(self, full_name: str) -> int:
        used = list(self.pulls[full_name]) + list(self.issues[full_name])
        return max(used, default=0) + 1

    def _git(self, bare: Path, *args: str) -> str:
        done = subprocess.run(["git", "--git-dir", str(bare), *args], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def branch_names(self, repo: Repo) -> dict[str, str]:
        """Seeded branches, overlaid by the linked repository's real ones."""
        if repo.bare is None:
            return dict(repo.branches)
        out = self._git(repo.bare, "for-each-ref", "--format=%(objectname) %(refname)",
                        "refs/heads")
        pairs = (line.split(" ", 1) for line in out.splitlines() if line)
        return {**repo.branches, **{ref.removeprefix("refs/heads/"): sha for sha, ref in pairs}}

    def branch_sha(self, repo: Repo, name: str) -> str | None:
        return self.branch_names(repo).get(name)

    def delete_branch(self, repo: Repo, name: str) -> None:
        if repo.bare is not None:
            self._git(repo.bare, "update-ref", "-d", f"refs/heads/{name}")
        repo.branches.pop(name, None)

    def refresh(self, full_name: str, pr: JSON) -> None:
        """Follow the head branch: new pushes move the head; a deleted head closes the PR."""
        sha = self.branch_sha(self.repos[pr["head_repo"]], pr["head_ref"])
        if sha is not None:
            pr["head_sha"] = sha
        elif pr["state"] == "open" and self.repos[pr["head_repo"]].bare is not None:
            pr["state"], pr["closed_at"] = "closed", NOW

    def pr_commits(self, full_name: str, pr: JSON) -> list[JSON]:
        repo = self.repos[full_name]
        head_repo = self.repos[pr["head_repo"]]
        if head_repo.bare is None:
            return list(pr["commits"])
        base = self.branch_sha(repo, pr["base_ref"]) or ""
        shas = self._git(head_repo.bare, "rev-list", "--reverse", pr["head_sha"], f"^{base}"
                         ) if base else self._git(head_repo.bare, "rev-list", "--reverse",
                                                  pr["head_sha"])
        return [self.git_commit(head_repo.bare, sha) for sha in shas.splitlines() if sha]

    def git_commit(self, bare: Path, sha: str) -> JSON:
        fmt = "%H%x00%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%B"
        parts = self._git(bare, "log", "-1", f"--format={fmt}", sha).split("\x00")
        return {"sha": parts[0], "parents": parts[1].split(), "author_name": parts[2],
                "author_email": parts[3], "author_date": parts[4], "committer_name": parts[5],
                "committer_email": parts[6], "committer_date": parts[7], "message": parts[8]}



# -- HTTP ----------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: FakeGitHub
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path).rstrip("/") or "/"
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        auth = self.headers.get("Authorization")
        self._wait_if_held(method, path)
        with self.server.lock:
            status, payload, headers = self._answer(method, path, query, body, auth)
            self.server.calls.append(Call(method, path, query, body, auth, status))
        if isinstance(payload, list) and status == 200:
            payload, headers = _paginate(self.server, path, query, payload, headers)
        self._send(status, payload, headers)

    def _wait_if_held(self, method: str, path: str) -> None:
        with self.server.lock:
            held = next((h for h in self.server.holds
                         if h[0] == method and re.fullmatch(h[1], path)), None)
            if held is not None:
                self.server.holds.remove(held)
        if held is not None:
            held[2].set()
            held[3].wait(timeout=60)

    def _answer(self, method: str, path: str, query: dict[str, str], body: Any,
                auth: str | None) -> tuple[int, Any, dict[str, str]]:
        s = self.server
        for failure in s.failures:
            if failure.method == method and re.fullmatch(failure.path_regex, path):
                failure.times -= 1
                if failure.times <= 0:
                    s.failures.remove(failure)
                return failure.status, failure.body, failure.headers
        if auth is None:
            return 401, error_body(401, "Requires authentication"), {}
        if auth not in (f"token {s.token}", f"Bearer {s.token}"):
            return 401, error_body(401, "Bad credentials"), {}
        return self._dispatch(method, path, query, body)

    def _dispatch(self, method: str, path: str, query: dict[str, str],
                  body: Any) -> tuple[int, Any, dict[str, str]]:
        known_path = False
        for route_method, pattern, fn in (*REST_ROUTES, *GIT_ROUTES):
            match = pattern.fullmatch(path)
            if match is None:
                continue
            known_path = True
            if route_method != method:
                continue
            req = Request(self.server, Render(self.server), method, path, query, body,
                           match.groupdict())
            try:
                status, payload = fn(req)
            except Reply as reply:
                return reply.status, reply.body, reply.headers
            return status, payload, {}
        if known_path:
            return 405, error_body(405, "Method Not Allowed"), {}
        return 404, error_body(404, "Not Found"), {}

    def _send(self, status: int, payload: Any, headers: dict[str, str]) -> None:
        data = b"" if status == 204 or payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        lower = {k.lower() for k in headers}
        for key, value in (("x-ratelimit-limit", "5000"), ("x-ratelimit-remaining", "4999"),
                           ("x-ratelimit-reset", "1900000000"), ("x-ratelimit-used", "1")):
            if key not in lower:
                self.send_header(key, value)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if data:
            self.wfile.write(data)


def _paginate(server: FakeGitHub, path: str, query: dict[str, str], items: list[Any],
              headers: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
    per_page = max(1, min(100, int(query.get("per_page", "30"))))
    page = max(1, int(query.get("page", "1")))
    last = max(1, -(-len(items) // per_page))
    links = []
    for rel, number in (("next", page + 1), ("last", last)):
        if page < last:
            params = urllib.parse.urlencode({**query, "page": str(number),
                                             "per_page": str(per_page)})
            links.append(f'<{server.base_url}{path}?{params}>; rel="{rel}"')
    headers = dict(headers)
    if links:
        headers["Link"] = ", ".join(links)
    return items[(page - 1) * per_page: page * per_page], headers



@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    """A started FakeGitHub (no repositories yet), shut down after the test."""
    with FakeGitHub() as server:
        yield server
