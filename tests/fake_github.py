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

PYTEST_DONT_REWRITE: the module holds no assertions, so a test may import it directly
and another name it in `pytest_plugins` without pytest warning that it came too late.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

JSON = dict[str, Any]
_NOW = "2026-01-15T12:00:00Z"
_DOCS = "https://docs.github.com/rest"
_REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
_ROLE_NAMES = {"admin": "admin", "maintain": "maintain", "write": "write", "triage": "triage",
               "read": "read", "none": "none"}
# GitHub's `permission` field only knows admin/write/read/none; role_name has the rest.
_PERMISSION_FIELD = {"admin": "admin", "maintain": "write", "write": "write",
                     "triage": "read", "read": "read", "none": "none"}
_MESSAGES = {400: "Bad Request", 401: "Bad credentials", 403: "Forbidden", 404: "Not Found",
             409: "Conflict", 422: "Validation Failed", 429: "Too Many Requests",
             500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Call:
    """One request as the server saw it (recorded even when it was refused)."""

    method: str
    path: str
    query: dict[str, str]
    json: Any
    authorization: str | None
    status: int

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass
class Failure:
    method: str
    path_regex: str
    status: int
    body: Any
    headers: dict[str, str]
    times: int


@dataclass
class _Repo:
    full_name: str
    id: int
    default_branch: str
    fork: bool
    private: bool
    parent: str | None
    branches: dict[str, str] = field(default_factory=dict)
    bare: Path | None = None


class _Reply(Exception):
    """Raised inside a handler to answer with a status and a JSON body."""

    def __init__(self, status: int, body: Any = None, headers: dict[str, str] | None = None):
        super().__init__(status)
        self.status = status
        self.body = body if body is not None else _error_body(status)
        self.headers = headers or {}


def _error_body(status: int, message: str | None = None) -> JSON:
    return {"message": message or _MESSAGES.get(status, "Error"), "documentation_url": _DOCS,
            "status": str(status)}


def _validation(message: str | None = None, field_name: str | None = None,
                code: str = "custom", resource: str = "PullRequest") -> _Reply:
    error: JSON = {"resource": resource, "code": code}
    if message is not None:
        error["message"] = message
    if field_name is not None:
        error["field"] = field_name
    return _Reply(422, {"message": "Validation Failed", "errors": [error],
                        "documentation_url": _DOCS, "status": "422"})


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
        self.repos: dict[str, _Repo] = {}
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
                 branches: dict[str, str] | None = None) -> _Repo:
        with self.lock:
            repo = _Repo(full_name, self.new_id(), default_branch, fork, private, parent,
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
        if permission not in _ROLE_NAMES:
            raise ValueError(f"unknown permission {permission!r}")
        with self.lock:
            self.permissions[(full_name, user)] = permission

    def add_issue(self, full_name: str, title: str = "An issue", body: str = "",
                  user: str = "alice", labels: tuple[str, ...] = ()) -> JSON:
        with self.lock:
            number = self._next_number(full_name)
            issue = {"number": number, "id": self.new_id(), "title": title, "body": body,
                     "user": user, "state": "open", "labels": list(labels),
                     "created_at": _NOW, "updated_at": _NOW, "closed_at": None}
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
            sha = head_sha or self._branch_sha(self.repos[source], head) or "0" * 40
            number = self._next_number(full_name)
            pr = {"number": number, "id": self.new_id(), "title": title, "body": body,
                  "user": user, "state": state, "draft": draft, "head_ref": head,
                  "head_repo": source, "head_sha": sha, "base_ref": base or repo.default_branch,
                  "labels": list(labels), "created_at": _NOW, "updated_at": _NOW,
                  "closed_at": None, "commits": []}
            self.pulls[full_name][number] = pr
            return pr

    def add_comment(self, full_name: str, number: int, body: str, user: str = "alice",
                    user_type: str = "User", association: str = "CONTRIBUTOR") -> JSON:
        with self.lock:
            comment = {"id": self.new_id(), "repo": full_name, "issue": number, "body": body,
                       "user": user, "user_type": user_type, "association": association,
                       "created_at": _NOW, "updated_at": _NOW}
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
                                         body if body is not None else _error_body(status),
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

    def _next_number(self, full_name: str) -> int:
        used = list(self.pulls[full_name]) + list(self.issues[full_name])
        return max(used, default=0) + 1

    def _git(self, bare: Path, *args: str) -> str:
        done = subprocess.run(["git", "--git-dir", str(bare), *args], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def branch_names(self, repo: _Repo) -> dict[str, str]:
        """Seeded branches, overlaid by the linked repository's real ones."""
        if repo.bare is None:
            return dict(repo.branches)
        out = self._git(repo.bare, "for-each-ref", "--format=%(objectname) %(refname)",
                        "refs/heads")
        pairs = (line.split(" ", 1) for line in out.splitlines() if line)
        return {**repo.branches, **{ref.removeprefix("refs/heads/"): sha for sha, ref in pairs}}

    def _branch_sha(self, repo: _Repo, name: str) -> str | None:
        return self.branch_names(repo).get(name)

    def _delete_branch(self, repo: _Repo, name: str) -> None:
        if repo.bare is not None:
            self._git(repo.bare, "update-ref", "-d", f"refs/heads/{name}")
        repo.branches.pop(name, None)

    def _refresh(self, full_name: str, pr: JSON) -> None:
        """Follow the head branch: new pushes move the head; a deleted head closes the PR."""
        sha = self._branch_sha(self.repos[pr["head_repo"]], pr["head_ref"])
        if sha is not None:
            pr["head_sha"] = sha
        elif pr["state"] == "open" and self.repos[pr["head_repo"]].bare is not None:
            pr["state"], pr["closed_at"] = "closed", _NOW

    def pr_commits(self, full_name: str, pr: JSON) -> list[JSON]:
        repo = self.repos[full_name]
        head_repo = self.repos[pr["head_repo"]]
        if head_repo.bare is None:
            return list(pr["commits"])
        base = self._branch_sha(repo, pr["base_ref"]) or ""
        shas = self._git(head_repo.bare, "rev-list", "--reverse", pr["head_sha"], f"^{base}"
                         ) if base else self._git(head_repo.bare, "rev-list", "--reverse",
                                                  pr["head_sha"])
        return [self._git_commit(head_repo.bare, sha) for sha in shas.splitlines() if sha]

    def _git_commit(self, bare: Path, sha: str) -> JSON:
        fmt = "%H%x00%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%B"
        parts = self._git(bare, "log", "-1", f"--format={fmt}", sha).split("\x00")
        return {"sha": parts[0], "parents": parts[1].split(), "author_name": parts[2],
                "author_email": parts[3], "author_date": parts[4], "committer_name": parts[5],
                "committer_email": parts[6], "committer_date": parts[7], "message": parts[8]}


# -- JSON rendering ------------------------------------------------------------------------


class _Render:
    """Turns stored records into GitHub-shaped JSON with URLs on this server."""

    def __init__(self, server: FakeGitHub) -> None:
        self.s = server
        self.api = server.base_url

    def user(self, login: str, kind: str | None = None) -> JSON:
        kind = kind or ("Bot" if login.endswith("[bot]") else "User")
        return {"login": login, "id": zlib.crc32(login.encode()),
                "node_id": f"U_{login}", "type": kind, "site_admin": False,
                "url": f"{self.api}/users/{login}", "html_url": f"https://github.com/{login}",
                "avatar_url": f"https://avatars.example/{login}"}

    def repo(self, repo: _Repo) -> JSON:
        owner, name = repo.full_name.split("/", 1)
        url = f"{self.api}/repos/{repo.full_name}"
        data = {"id": repo.id, "node_id": f"R_{repo.id}", "name": name,
                "full_name": repo.full_name, "private": repo.private, "fork": repo.fork,
                "owner": self.user(owner, "Organization"), "url": url,
                "html_url": f"https://github.com/{repo.full_name}",
                "clone_url": str(repo.bare) if repo.bare else
                f"https://github.com/{repo.full_name}.git",
                "default_branch": repo.default_branch, "description": None,
                "visibility": "private" if repo.private else "public",
                "archived": False, "disabled": False,
                "pulls_url": f"{url}/pulls{{/number}}", "issues_url": f"{url}/issues{{/number}}",
                "created_at": _NOW, "updated_at": _NOW, "pushed_at": _NOW,
                "permissions": {"admin": False, "push": True, "pull": True}}
        if repo.parent is not None and repo.parent in self.s.repos:
            data["parent"] = data["source"] = self.repo(self.s.repos[repo.parent])
        return data

    def label(self, full_name: str, name: str) -> JSON:
        stored = self.s.labels[full_name].setdefault(
            name, {"id": self.s.new_id(), "name": name, "color": "ededed",
                   "description": None, "default": False})
        return {**stored, "node_id": f"LA_{stored['id']}",
                "url": f"{self.api}/repos/{full_name}/labels/{urllib.parse.quote(name)}"}

    def ref_side(self, repo: _Repo, ref: str, sha: str) -> JSON:
        owner = repo.full_name.split("/", 1)[0]
        return {"label": f"{owner}:{ref}", "ref": ref, "sha": sha,
                "user": self.user(owner, "Organization"), "repo": self.repo(repo)}

    def pull(self, full_name: str, pr: JSON) -> JSON:
        self.s._refresh(full_name, pr)
        repo = self.s.repos[full_name]
        n = pr["number"]
        url = f"{self.api}/repos/{full_name}/pulls/{n}"
        issue_url = f"{self.api}/repos/{full_name}/issues/{n}"
        base_sha = self.s._branch_sha(repo, pr["base_ref"]) or "0" * 40
        html = f"https://github.com/{full_name}/pull/{n}"
        return {"id": pr["id"], "node_id": f"PR_{pr['id']}", "number": n, "url": url,
                "html_url": html, "diff_url": f"{html}.diff", "patch_url": f"{html}.patch",
                "issue_url": issue_url, "commits_url": f"{url}/commits",
                "comments_url": f"{issue_url}/comments",
                "review_comments_url": f"{url}/comments",
                "statuses_url": f"{self.api}/repos/{full_name}/statuses/{pr['head_sha']}",
                "state": pr["state"], "locked": False, "title": pr["title"], "body": pr["body"],
                "user": self.user(pr["user"]),
                "labels": [self.label(full_name, name) for name in pr["labels"]],
                "milestone": None, "active_lock_reason": None, "created_at": pr["created_at"],
                "updated_at": pr["updated_at"], "closed_at": pr["closed_at"],
                "merged_at": None, "merge_commit_sha": None, "assignee": None,
                "assignees": [], "requested_reviewers": [], "requested_teams": [],
                "head": self.ref_side(self.s.repos[pr["head_repo"]], pr["head_ref"],
                                      pr["head_sha"]),
                "base": self.ref_side(repo, pr["base_ref"], base_sha),
                "author_association": "NONE", "auto_merge": None, "draft": pr["draft"],
                "merged": False, "mergeable": True, "rebaseable": True,
                "mergeable_state": "clean", "merged_by": None, "comments": 0,
                "review_comments": 0, "maintainer_can_modify": False,
                "commits": len(self.s.pr_commits(full_name, pr)), "additions": 0,
                "deletions": 0, "changed_files": 0}

    def issue(self, full_name: str, number: int) -> JSON:
        pr = self.s.pulls[full_name].get(number)
        record = pr if pr is not None else self.s.issues[full_name][number]
        if pr is not None:
            self.s._refresh(full_name, pr)
        url = f"{self.api}/repos/{full_name}/issues/{number}"
        kind = "pull" if pr is not None else "issues"
        data = {"id": record["id"], "node_id": f"I_{record['id']}", "number": number,
                "url": url, "repository_url": f"{self.api}/repos/{full_name}",
                "labels_url": f"{url}/labels{{/name}}", "comments_url": f"{url}/comments",
                "events_url": f"{url}/events",
                "html_url": f"https://github.com/{full_name}/{kind}/{number}",
                "title": record["title"], "body": record["body"],
                "user": self.user(record["user"]), "state": record["state"], "locked": False,
                "labels": [self.label(full_name, name) for name in record["labels"]],
                "assignee": None, "assignees": [], "milestone": None,
                "comments": len(self.s.comments_on(full_name, number)),
                "created_at": record["created_at"], "updated_at": record["updated_at"],
                "closed_at": record["closed_at"], "author_association": "NONE"}
        if pr is not None:
            pull_url = f"{self.api}/repos/{full_name}/pulls/{number}"
            data["pull_request"] = {"url": pull_url, "html_url": data["html_url"],
                                    "diff_url": f"{data['html_url']}.diff",
                                    "patch_url": f"{data['html_url']}.patch"}
            data["draft"] = pr["draft"]
        return data

    def comment(self, comment: JSON) -> JSON:
        full_name, cid = comment["repo"], comment["id"]
        url = f"{self.api}/repos/{full_name}/issues/comments/{cid}"
        kind = "pull" if comment["issue"] in self.s.pulls[full_name] else "issues"
        counts = {content: 0 for content in _REACTIONS}
        for reaction in self.s.reactions.get(cid, []):
            counts[reaction["content"]] += 1
        return {"id": cid, "node_id": f"IC_{cid}", "url": url,
                "html_url": f"https://github.com/{full_name}/{kind}/{comment['issue']}"
                            f"#issuecomment-{cid}",
                "issue_url": f"{self.api}/repos/{full_name}/issues/{comment['issue']}",
                "body": comment["body"], "user": self.user(comment["user"], comment["user_type"]),
                "created_at": comment["created_at"], "updated_at": comment["updated_at"],
                "author_association": comment["association"],
                "reactions": {"url": f"{url}/reactions", "total_count": sum(counts.values()),
                              **counts}}

    def reaction(self, reaction: JSON) -> JSON:
        return {"id": reaction["id"], "node_id": f"REA_{reaction['id']}",
                "user": self.user(reaction["user"]), "content": reaction["content"],
                "created_at": _NOW}

    def commit(self, full_name: str, c: JSON) -> JSON:
        url = f"{self.api}/repos/{full_name}/commits/{c['sha']}"

        def person(kind: str) -> JSON:
            return {"name": c[f"{kind}_name"], "email": c[f"{kind}_email"],
                    "date": c[f"{kind}_date"]}

        return {"sha": c["sha"], "node_id": f"C_{c['sha']}", "url": url,
                "html_url": f"https://github.com/{full_name}/commit/{c['sha']}",
                "commit": {"author": person("author"), "committer": person("committer"),
                           "message": c["message"], "url": url,
                           "tree": {"sha": "0" * 40, "url": url}, "comment_count": 0},
                "author": None, "committer": None,
                "parents": [{"sha": p, "url": f"{self.api}/repos/{full_name}/commits/{p}"}
                            for p in c["parents"]]}

    def branch(self, full_name: str, name: str, sha: str) -> JSON:
        url = f"{self.api}/repos/{full_name}"
        return {"name": name, "protected": False,
                "commit": {"sha": sha, "url": f"{url}/commits/{sha}",
                           "node_id": f"C_{sha}"},
                "_links": {"self": f"{url}/branches/{name}",
                           "html": f"https://github.com/{full_name}/tree/{name}"}}

    def ref(self, full_name: str, name: str, sha: str) -> JSON:
        url = f"{self.api}/repos/{full_name}/git/refs/heads/{name}"
        return {"ref": f"refs/heads/{name}", "node_id": f"REF_{name}", "url": url,
                "object": {"sha": sha, "type": "commit",
                           "url": f"{self.api}/repos/{full_name}/git/commits/{sha}"}}


# -- routing -------------------------------------------------------------------------------

Handler = Callable[["_Request"], tuple[int, Any]]
_ROUTES: list[tuple[str, re.Pattern[str], Handler]] = []


def _route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _ROUTES.append((method, re.compile(pattern), fn))
        return fn
    return register


@dataclass
class _Request:
    server: FakeGitHub
    render: _Render
    method: str
    path: str
    query: dict[str, str]
    body: Any
    params: dict[str, str]

    @property
    def full_name(self) -> str:
        full_name = f"{self.params['owner']}/{self.params['repo']}"
        if full_name not in self.server.repos:
            raise _Reply(404)
        return full_name

    @property
    def number(self) -> int:
        return int(self.params["number"])

    def pull(self) -> JSON:
        pr = self.server.pulls[self.full_name].get(self.number)
        if pr is None:
            raise _Reply(404)
        return pr

    def issue_exists(self) -> None:
        full_name = self.full_name
        if self.number not in self.server.pulls[full_name] and \
                self.number not in self.server.issues[full_name]:
            raise _Reply(404)

    def comment(self) -> JSON:
        comment = self.server.comments.get(int(self.params["id"]))
        if comment is None or comment["repo"] != self.full_name:
            raise _Reply(404)
        return comment

    def field(self, name: str) -> Any:
        if not isinstance(self.body, dict) or name not in self.body:
            raise _validation(field_name=name, code="missing_field", resource="Request")
        return self.body[name]


_REPO = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"


@_route("GET", r"/user")
def _get_user(req: _Request) -> tuple[int, Any]:
    return 200, req.render.user(req.server.login)


@_route("GET", r"/rate_limit")
def _rate_limit(req: _Request) -> tuple[int, Any]:
    core = {"limit": 5000, "remaining": 4999, "reset": 1_900_000_000, "used": 1}
    return 200, {"resources": {"core": core, "search": core, "graphql": core}, "rate": core}


@_route("GET", _REPO)
def _get_repo(req: _Request) -> tuple[int, Any]:
    return 200, req.render.repo(req.server.repos[req.full_name])


@_route("GET", _REPO + r"/pulls")
def _list_pulls(req: _Request) -> tuple[int, Any]:
    full_name = req.full_name
    state = req.query.get("state", "open")
    out = []
    for pr in sorted(req.server.pulls[full_name].values(), key=lambda p: -p["number"]):
        data = req.render.pull(full_name, pr)
        if state != "all" and data["state"] != state:
            continue
        head = req.query.get("head")
        if head and head != (data["head"]["label"] if ":" in head else data["head"]["ref"]):
            continue
        if "base" in req.query and data["base"]["ref"] != req.query["base"]:
            continue
        out.append(data)
    return 200, out


def _split_head(req: _Request, full_name: str, head: str) -> tuple[str, str]:
    """`branch` or `owner:branch` -> (repository holding the branch, branch)."""
    if ":" not in head:
        return full_name, head
    owner, ref = head.split(":", 1)
    name = full_name.split("/", 1)[1]
    if owner == full_name.split("/", 1)[0]:
        return full_name, ref
    for repo in req.server.repos.values():
        if repo.full_name.split("/", 1)[0] == owner and repo.parent == full_name:
            return repo.full_name, ref
    return f"{owner}/{name}", ref


@_route("POST", _REPO + r"/pulls")
def _create_pull(req: _Request) -> tuple[int, Any]:
    s, full_name = req.server, req.full_name
    head, base = str(req.field("head")), str(req.field("base"))
    req.field("title")
    head_repo, ref = _split_head(req, full_name, head)
    if head_repo not in s.repos:
        raise _validation(field_name="head", code="invalid")
    for pr in s.pulls[full_name].values():
        s._refresh(full_name, pr)
        if (pr["state"] == "open" and pr["head_repo"] == head_repo and pr["head_ref"] == ref
                and pr["base_ref"] == base):
            owner = head_repo.split("/", 1)[0]
            raise _validation(f"A pull request already exists for {owner}:{ref}.")
    head_sha = s._branch_sha(s.repos[head_repo], ref)
    base_sha = s._branch_sha(s.repos[full_name], base)
    if head_sha is None:
        raise _validation(field_name="head", code="invalid")
    if base_sha is None:
        raise _validation(field_name="base", code="invalid")
    if head_sha == base_sha:
        raise _validation(f"No commits between {base} and {ref}")
    pr = s.add_pull(full_name, head=ref, base=base, title=str(req.body["title"]),
                    body=str(req.body.get("body") or ""), user=s.login,
                    draft=bool(req.body.get("draft", False)), head_repo=head_repo,
                    head_sha=head_sha)
    return 201, req.render.pull(full_name, pr)


@_route("GET", _REPO + r"/pulls/(?P<number>\d+)")
def _get_pull(req: _Request) -> tuple[int, Any]:
    return 200, req.render.pull(req.full_name, req.pull())


@_route("PATCH", _REPO + r"/pulls/(?P<number>\d+)")
def _edit_pull(req: _Request) -> tuple[int, Any]:
    pr = req.pull()
    body = req.body if isinstance(req.body, dict) else {}
    for key in ("title", "body"):
        if key in body:
            pr[key] = body[key]
    if body.get("state") in ("open", "closed"):
        pr["state"] = body["state"]
        pr["closed_at"] = _NOW if body["state"] == "closed" else None
    if "base" in body:
        pr["base_ref"] = body["base"]
    pr["updated_at"] = _NOW
    return 200, req.render.pull(req.full_name, pr)


@_route("POST", r"/graphql")
def _graphql(req: _Request) -> tuple[int, Any]:
    """The one mutation kfbot sends: turning an open pull request into a draft."""
    query = req.body.get("query", "") if isinstance(req.body, dict) else ""
    if "convertPullRequestToDraft" not in query:
        return 200, {"errors": [{"message": "the fake answers convertPullRequestToDraft only"}]}
    node = str(req.body.get("variables", {}).get("input", {}).get("pullRequestId", ""))
    for pulls in req.server.pulls.values():
        for pr in pulls.values():
            if f"PR_{pr['id']}" == node:
                pr["draft"] = True
                pr["updated_at"] = _NOW
                return 200, {"data": {"convertPullRequestToDraft": {
                    "clientMutationId": None, "pullRequest": {"isDraft": True}}}}
    return 200, {"errors": [{"message": f"no pull request with id {node}"}]}


@_route("GET", _REPO + r"/pulls/(?P<number>\d+)/commits")
def _pull_commits(req: _Request) -> tuple[int, Any]:
    full_name, pr = req.full_name, req.pull()
    req.server._refresh(full_name, pr)
    return 200, [req.render.commit(full_name, c) for c in req.server.pr_commits(full_name, pr)]


@_route("GET", _REPO + r"/issues/(?P<number>\d+)")
def _get_issue(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    return 200, req.render.issue(req.full_name, req.number)


def _record(req: _Request) -> JSON:
    full_name = req.full_name
    pr = req.server.pulls[full_name].get(req.number)
    return pr if pr is not None else req.server.issues[full_name][req.number]


@_route("PATCH", _REPO + r"/issues/(?P<number>\d+)")
def _edit_issue(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    record, body = _record(req), req.body if isinstance(req.body, dict) else {}
    for key in ("title", "body", "state"):
        if key in body:
            record[key] = body[key]
    if "labels" in body:
        record["labels"] = [str(name) for name in body["labels"]]
    return 200, req.render.issue(req.full_name, req.number)


@_route("GET", _REPO + r"/issues/(?P<number>\d+)/comments")
def _list_comments(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    comments = req.server.comments_on(req.full_name, req.number)
    return 200, [req.render.comment(c) for c in comments]


@_route("POST", _REPO + r"/issues/(?P<number>\d+)/comments")
def _create_comment(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    s = req.server
    comment = s.add_comment(req.full_name, req.number, str(req.field("body")), user=s.login,
                            user_type="Bot" if s.login.endswith("[bot]") else "User",
                            association="NONE")
    return 201, req.render.comment(comment)


@_route("GET", _REPO + r"/issues/comments/(?P<id>\d+)")
def _get_comment(req: _Request) -> tuple[int, Any]:
    return 200, req.render.comment(req.comment())


@_route("PATCH", _REPO + r"/issues/comments/(?P<id>\d+)")
def _edit_comment(req: _Request) -> tuple[int, Any]:
    comment = req.comment()
    comment["body"] = str(req.field("body"))
    comment["updated_at"] = _NOW
    return 200, req.render.comment(comment)


@_route("DELETE", _REPO + r"/issues/comments/(?P<id>\d+)")
def _delete_comment(req: _Request) -> tuple[int, Any]:
    req.server.comments.pop(req.comment()["id"])
    return 204, None


def _add_reaction(req: _Request, reactions: list[JSON]) -> tuple[int, Any]:
    content = req.field("content")
    if content not in _REACTIONS:
        raise _validation(field_name="content", code="invalid", resource="Reaction")
    for reaction in reactions:
        if reaction["user"] == req.server.login and reaction["content"] == content:
            return 200, req.render.reaction(reaction)
    reaction = {"id": req.server.new_id(), "user": req.server.login, "content": content}
    reactions.append(reaction)
    return 201, req.render.reaction(reaction)


@_route("POST", _REPO + r"/issues/comments/(?P<id>\d+)/reactions")
def _react_comment(req: _Request) -> tuple[int, Any]:
    return _add_reaction(req, req.server.reactions.setdefault(req.comment()["id"], []))


@_route("GET", _REPO + r"/issues/comments/(?P<id>\d+)/reactions")
def _comment_reactions(req: _Request) -> tuple[int, Any]:
    reactions = req.server.reactions.get(req.comment()["id"], [])
    return 200, [req.render.reaction(r) for r in reactions]


@_route("POST", _REPO + r"/issues/(?P<number>\d+)/reactions")
def _react_issue(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    key = (req.full_name, req.number)
    return _add_reaction(req, req.server.issue_reactions.setdefault(key, []))


@_route("GET", _REPO + r"/issues/(?P<number>\d+)/reactions")
def _issue_reactions(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    reactions = req.server.issue_reactions.get((req.full_name, req.number), [])
    return 200, [req.render.reaction(r) for r in reactions]


def _label_names(body: Any) -> list[str]:
    names = body.get("labels") if isinstance(body, dict) else body
    if not isinstance(names, list):
        raise _validation(field_name="labels", code="invalid", resource="Label")
    return [str(n["name"]) if isinstance(n, dict) else str(n) for n in names]


@_route("POST", _REPO + r"/issues/(?P<number>\d+)/labels")
def _add_labels(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    record = _record(req)
    for name in _label_names(req.body):
        if name not in record["labels"]:
            record["labels"].append(name)
    return 200, [req.render.label(req.full_name, name) for name in record["labels"]]


@_route("PUT", _REPO + r"/issues/(?P<number>\d+)/labels")
def _set_labels(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    record = _record(req)
    record["labels"] = _label_names(req.body)
    return 200, [req.render.label(req.full_name, name) for name in record["labels"]]


@_route("GET", _REPO + r"/issues/(?P<number>\d+)/labels")
def _get_labels(req: _Request) -> tuple[int, Any]:
    req.issue_exists()
    return 200, [req.render.label(req.full_name, name) for name in _record(req)["labels"]]


@_route("GET", _REPO + r"/collaborators/(?P<user>[^/]+)/permission")
def _permission(req: _Request) -> tuple[int, Any]:
    user = req.params["user"]
    permission = req.server.permissions.get((req.full_name, user))
    if permission is None:
        raise _Reply(404, _error_body(404, "Not Found"))
    return 200, {"permission": _PERMISSION_FIELD[permission],
                 "role_name": _ROLE_NAMES[permission], "user": req.render.user(user)}


@_route("GET", _REPO + r"/contents/(?P<path>.+)")
def _get_contents(req: _Request) -> tuple[int, Any]:
    """A file of a linked repository (`link_remote`) at `?ref=` (default: default branch)."""
    import base64
    import hashlib

    repo = req.server.repos[req.full_name]
    path, ref = req.params["path"], req.query.get("ref") or repo.default_branch
    shown = subprocess.run(["git", "--git-dir", str(repo.bare), "show", f"{ref}:{path}"],
                           capture_output=True, check=False) if repo.bare else None
    if shown is None or shown.returncode != 0:
        raise _Reply(404)
    url = f"{req.render.api}/repos/{req.full_name}/contents/{path}"
    html = f"https://github.com/{req.full_name}/blob/{ref}/{path}"
    return 200, {"type": "file", "encoding": "base64", "size": len(shown.stdout),
                 "name": path.rsplit("/", 1)[-1], "path": path, "url": url, "html_url": html,
                 "content": base64.b64encode(shown.stdout).decode(),
                 "sha": hashlib.sha1(b"blob %d\0" % len(shown.stdout) + shown.stdout).hexdigest(),
                 "git_url": None, "download_url": None, "_links": {"self": url, "html": html}}


@_route("GET", _REPO + r"/branches/(?P<branch>.+)")
def _get_branch(req: _Request) -> tuple[int, Any]:
    full_name, name = req.full_name, req.params["branch"]
    sha = req.server._branch_sha(req.server.repos[full_name], name)
    if sha is None:
        raise _Reply(404, _error_body(404, "Branch not found"))
    return 200, req.render.branch(full_name, name, sha)


@_route("GET", _REPO + r"/git/ref/heads/(?P<branch>.+)")
def _get_ref(req: _Request) -> tuple[int, Any]:
    full_name, name = req.full_name, req.params["branch"]
    sha = req.server._branch_sha(req.server.repos[full_name], name)
    if sha is None:
        raise _Reply(404)
    return 200, req.render.ref(full_name, name, sha)


@_route("GET", _REPO + r"/git/refs/heads/(?P<branch>.+)")
def _get_refs(req: _Request) -> tuple[int, Any]:
    return _get_ref(req)


@_route("DELETE", _REPO + r"/git/refs/heads/(?P<branch>.+)")
def _delete_ref(req: _Request) -> tuple[int, Any]:
    repo = req.server.repos[req.full_name]
    if req.server._branch_sha(repo, req.params["branch"]) is None:
        raise _Reply(422, _error_body(422, "Reference does not exist"))
    req.server._delete_branch(repo, req.params["branch"])
    return 204, None


# -- the Git Data API, on the linked bare repository ----------------------------------------


def _bare(req: _Request) -> Path:
    bare = req.server.repos[req.full_name].bare
    if bare is None:
        raise _Reply(409, _error_body(409, "Git Repository is empty."))
    return bare


def _git_out(bare: Path, *args: str, data: bytes | None = None,
             env: dict[str, str] | None = None, missing: int = 404) -> bytes:
    """git in the bare repository; a failure is answered as GitHub would (404 or 422)."""
    import os

    done = subprocess.run(["git", "--git-dir", str(bare), *args], input=data,
                          capture_output=True, check=False, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise _Reply(missing, _error_body(missing, "Not Found" if missing == 404 else
                                          done.stderr.decode(errors="replace").strip()[:200]))
    return done.stdout


def _object_type(bare: Path, sha: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        return ""
    done = subprocess.run(["git", "--git-dir", str(bare), "cat-file", "-t", sha],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def _git_commit_json(req: _Request, sha: str) -> JSON:
    bare, api = _bare(req), f"{req.render.api}/repos/{req.full_name}"
    if _object_type(bare, sha) != "commit":
        raise _Reply(404)
    fmt = "%H%x00%T%x00%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%B"
    parts = _git_out(bare, "log", "-1", f"--format={fmt}", sha).decode().split("\x00")

    def person(i: int) -> JSON:
        return {"name": parts[i], "email": parts[i + 1], "date": parts[i + 2]}

    return {"sha": parts[0], "node_id": f"C_{parts[0]}", "url": f"{api}/git/commits/{sha}",
            "html_url": f"https://github.com/{req.full_name}/commit/{sha}",
            "author": person(3), "committer": person(6), "message": parts[9].rstrip("\n"),
            "tree": {"sha": parts[1], "url": f"{api}/git/trees/{parts[1]}"},
            "parents": [{"sha": p, "url": f"{api}/git/commits/{p}",
                         "html_url": f"https://github.com/{req.full_name}/commit/{p}"}
                        for p in parts[2].split()],
            "verification": {"verified": False, "reason": "unsigned", "signature": None,
                             "payload": None}}


def _tree_json(req: _Request, sha: str, recursive: bool) -> JSON:
    bare, api = _bare(req), f"{req.render.api}/repos/{req.full_name}"
    if _object_type(bare, sha) != "tree":
        raise _Reply(404)
    args = ["ls-tree", "-z", "--long", *(["-r", "-t"] if recursive else []), sha]
    entries = []
    for record in _git_out(bare, *args).split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, obj, size = meta.decode().split()
        entry: JSON = {"path": path.decode("utf-8", "surrogateescape"), "mode": mode,
                       "type": kind, "sha": obj, "url": f"{api}/git/{kind}s/{obj}"}
        if kind == "blob":
            entry["size"] = int(size)
        entries.append(entry)
    return {"sha": sha, "url": f"{api}/git/trees/{sha}", "tree": entries, "truncated": False}


@_route("GET", _REPO + r"/git/commits/(?P<sha>[0-9a-f]+)")
def _get_git_commit(req: _Request) -> tuple[int, Any]:
    return 200, _git_commit_json(req, req.params["sha"])


@_route("GET", _REPO + r"/git/trees/(?P<sha>[0-9a-f]+)")
def _get_tree(req: _Request) -> tuple[int, Any]:
    return 200, _tree_json(req, req.params["sha"], req.query.get("recursive") not in
                           (None, "", "0", "false"))


@_route("GET", _REPO + r"/git/blobs/(?P<sha>[0-9a-f]+)")
def _get_blob(req: _Request) -> tuple[int, Any]:
    import base64

    bare, sha = _bare(req), req.params["sha"]
    if _object_type(bare, sha) != "blob":
        raise _Reply(404)
    data = _git_out(bare, "cat-file", "blob", sha)
    encoded = base64.b64encode(data).decode()
    lines = "\n".join(encoded[i:i + 60] for i in range(0, len(encoded), 60))
    return 200, {"sha": sha, "node_id": f"B_{sha}", "size": len(data), "encoding": "base64",
                 "content": lines + "\n",
                 "url": f"{req.render.api}/repos/{req.full_name}/git/blobs/{sha}"}


@_route("POST", _REPO + r"/git/blobs")
def _create_blob(req: _Request) -> tuple[int, Any]:
    import base64
    import binascii

    content, encoding = req.field("content"), req.body.get("encoding", "utf-8")
    if not isinstance(content, str) or encoding not in ("utf-8", "base64"):
        raise _validation(field_name="encoding", code="invalid", resource="Blob")
    try:
        data = base64.b64decode(content, validate=True) if encoding == "base64" \
            else content.encode()
    except binascii.Error:
        raise _validation("content is not valid Base64", resource="Blob") from None
    sha = _git_out(_bare(req), "hash-object", "-w", "--stdin", data=data).decode().strip()
    return 201, {"sha": sha, "url": f"{req.render.api}/repos/{req.full_name}/git/blobs/{sha}"}


@_route("POST", _REPO + r"/git/trees")
def _create_tree(req: _Request) -> tuple[int, Any]:
    """GitHub's tree creation: entries on top of `base_tree`, nested paths made as trees."""
    import tempfile

    bare, entries = _bare(req), req.field("tree")
    base = req.body.get("base_tree")
    with tempfile.TemporaryDirectory(prefix="fake-github-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if base:
            if _object_type(bare, str(base)) != "tree":
                raise _validation("base_tree is not a valid tree oid", resource="Tree")
            _git_out(bare, "read-tree", str(base), env=env)
        for entry in entries:
            path, mode, sha = str(entry.get("path", "")), str(entry.get("mode", "")), \
                entry.get("sha")
            if mode not in ("100644", "100755", "040000", "160000", "120000") or not path:
                raise _validation("tree.mode or tree.path is invalid", resource="Tree")
            if "content" in entry:
                sha = _git_out(bare, "hash-object", "-w", "--stdin",
                               data=str(entry["content"]).encode()).decode().strip()
            if sha is None:
                _git_out(bare, "update-index", "--force-remove", "--", path, env=env,
                         missing=422)
                continue
            if _object_type(bare, str(sha)) not in ("blob", "commit"):
                raise _validation(f"tree.sha {sha} is not a valid blob", resource="Tree")
            _git_out(bare, "update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}",
                     env=env, missing=422)
        tree = _git_out(bare, "write-tree", env=env, missing=422).decode().strip()
    return 201, _tree_json(req, tree, False)


@_route("POST", _REPO + r"/git/commits")
def _create_git_commit(req: _Request) -> tuple[int, Any]:
    bare, tree = _bare(req), str(req.field("tree"))
    message, parents = str(req.field("message")), req.body.get("parents") or []
    if _object_type(bare, tree) != "tree":
        raise _validation("Tree SHA does not exist", resource="Commit")
    if any(_object_type(bare, str(p)) != "commit" for p in parents):
        raise _validation("Parent SHA does not exist or is not a commit object",
                          resource="Commit")
    login = req.server.login
    author = req.body.get("author") or {"name": login, "email": f"{login}@users.noreply"}
    committer = req.body.get("committer") or author
    env = {"GIT_AUTHOR_NAME": author["name"], "GIT_AUTHOR_EMAIL": author["email"],
           "GIT_COMMITTER_NAME": committer["name"], "GIT_COMMITTER_EMAIL": committer["email"],
           "GIT_AUTHOR_DATE": _NOW, "GIT_COMMITTER_DATE": _NOW}
    args = ["commit-tree", tree, *[a for p in parents for a in ("-p", str(p))]]
    sha = _git_out(bare, *args, data=message.encode(), env=env, missing=422).decode().strip()
    return 201, _git_commit_json(req, sha)


@_route("POST", _REPO + r"/git/refs")
def _create_ref(req: _Request) -> tuple[int, Any]:
    bare, ref, sha = _bare(req), str(req.field("ref")), str(req.field("sha"))
    if not ref.startswith("refs/") or ref.count("/") < 2:
        raise _validation("Reference name is invalid", resource="Reference")
    if _object_type(bare, sha) != "commit":
        raise _validation("Object does not exist", resource="Reference")
    exists = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "-q", ref],
                            capture_output=True, check=False).returncode == 0
    if exists:
        raise _validation("Reference already exists", resource="Reference")
    _git_out(bare, "update-ref", ref, sha, "0" * 40, missing=422)
    name = ref.removeprefix("refs/heads/")
    return 201, req.render.ref(req.full_name, name, sha)


@_route("PATCH", _REPO + r"/git/refs/heads/(?P<branch>.+)")
def _update_ref(req: _Request) -> tuple[int, Any]:
    bare, name, sha = _bare(req), req.params["branch"], str(req.field("sha"))
    old = req.server._branch_sha(req.server.repos[req.full_name], name)
    if old is None:
        raise _Reply(422, _error_body(422, "Reference does not exist"))
    if _object_type(bare, sha) != "commit":
        raise _validation("Object does not exist", resource="Reference")
    fast_forward = subprocess.run(["git", "--git-dir", str(bare), "merge-base",
                                   "--is-ancestor", old, sha], check=False).returncode == 0
    if not fast_forward and not req.body.get("force"):
        raise _Reply(422, _error_body(422, "Update is not a fast forward"))
    _git_out(bare, "update-ref", f"refs/heads/{name}", sha, old, missing=422)
    return 200, req.render.ref(req.full_name, name, sha)


@_route("GET", _REPO + r"/compare/(?P<base>[^.]+)\.\.\.(?P<head>.+)")
def _compare(req: _Request) -> tuple[int, Any]:
    bare, api = _bare(req), f"{req.render.api}/repos/{req.full_name}"
    repo = req.server.repos[req.full_name]
    ends = [req.server._branch_sha(repo, req.params[k]) or req.params[k] for k in ("base", "head")]
    if any(_object_type(bare, sha) != "commit" for sha in ends):
        raise _Reply(404, _error_body(404, "Not Found"))
    base, head = ends
    fork = _git_out(bare, "merge-base", base, head).decode().strip()
    ahead = _git_out(bare, "rev-list", "--reverse", head, f"^{fork}").decode().split()
    behind = _git_out(bare, "rev-list", base, f"^{fork}").decode().split()
    status = "identical" if not ahead and not behind else "ahead" if not behind else \
        "behind" if not ahead else "diverged"
    commits = [req.render.commit(req.full_name, req.server._git_commit(bare, sha))
               for sha in ahead]
    html = f"https://github.com/{req.full_name}/compare/{req.params['base']}...{req.params['head']}"
    return 200, {"url": f"{api}/compare/{req.params['base']}...{req.params['head']}",
                 "html_url": html, "permalink_url": html, "diff_url": f"{html}.diff",
                 "patch_url": f"{html}.patch", "status": status, "ahead_by": len(ahead),
                 "behind_by": len(behind), "total_commits": len(ahead), "commits": commits,
                 "files": [],
                 "base_commit": req.render.commit(req.full_name,
                                                  req.server._git_commit(bare, base)),
                 "merge_base_commit": req.render.commit(req.full_name,
                                                        req.server._git_commit(bare, fork))}


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
            return 401, _error_body(401, "Requires authentication"), {}
        if auth not in (f"token {s.token}", f"Bearer {s.token}"):
            return 401, _error_body(401, "Bad credentials"), {}
        return self._dispatch(method, path, query, body)

    def _dispatch(self, method: str, path: str, query: dict[str, str],
                  body: Any) -> tuple[int, Any, dict[str, str]]:
        known_path = False
        for route_method, pattern, fn in _ROUTES:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            known_path = True
            if route_method != method:
                continue
            req = _Request(self.server, _Render(self.server), method, path, query, body,
                           match.groupdict())
            try:
                status, payload = fn(req)
            except _Reply as reply:
                return reply.status, reply.body, reply.headers
            return status, payload, {}
        if known_path:
            return 405, _error_body(405, "Method Not Allowed"), {}
        return 404, _error_body(404, "Not Found"), {}

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
