"""The fake GitHub server's REST endpoints (fake_github.py): users, repositories, pull
requests, issues, comments, reactions, labels, permissions, contents, branches and refs;
and the routing they and the Git Data endpoints share."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fake_github_records import (
    JSON,
    NOW,
    PERMISSION_FIELD,
    REACTIONS,
    ROLE_NAMES,
    Reply,
    error_body,
    validation,
)
from fake_github_render import Render

if TYPE_CHECKING:
    from fake_github import FakeGitHub

Handler = Callable[["Request"], tuple[int, Any]]
Routes = list[tuple[str, re.Pattern[str], Handler]]


def router(routes: Routes) -> Callable[[str, str], Callable[[Handler], Handler]]:
    """A decorator that adds a handler for (method, path pattern) to `routes`."""
    def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            routes.append((method, re.compile(pattern), fn))
            return fn
        return register
    return route


ROUTES: Routes = []  # the REST endpoints below, in the order they are matched
route = router(ROUTES)


@dataclass
class Request:
    server: FakeGitHub
    render: Render
    method: str
    path: str
    query: dict[str, str]
    body: Any
    params: dict[str, str]

    @property
    def full_name(self) -> str:
        full_name = f"{self.params['owner']}/{self.params['repo']}"
        if full_name not in self.server.repos:
            raise Reply(404)
        return full_name

    @property
    def number(self) -> int:
        return int(self.params["number"])

    def pull(self) -> JSON:
        pr = self.server.pulls[self.full_name].get(self.number)
        if pr is None:
            raise Reply(404)
        return pr

    def issue_exists(self) -> None:
        full_name = self.full_name
        if self.number not in self.server.pulls[full_name] and \
                self.number not in self.server.issues[full_name]:
            raise Reply(404)

    def comment(self) -> JSON:
        comment = self.server.comments.get(int(self.params["id"]))
        if comment is None or comment["repo"] != self.full_name:
            raise Reply(404)
        return comment

    def field(self, name: str) -> Any:
        if not isinstance(self.body, dict) or name not in self.body:
            raise validation(field_name=name, code="missing_field", resource="Request")
        return self.body[name]


REPO = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"


@route("GET", r"/user")
def _get_user(req: Request) -> tuple[int, Any]:
    return 200, req.render.user(req.server.login)


@route("GET", r"/rate_limit")
def _rate_limit(req: Request) -> tuple[int, Any]:
    core = {"limit": 5000, "remaining": 4999, "reset": 1_900_000_000, "used": 1}
    return 200, {"resources": {"core": core, "search": core, "graphql": core}, "rate": core}


@route("GET", REPO)
def _get_repo(req: Request) -> tuple[int, Any]:
    return 200, req.render.repo(req.server.repos[req.full_name])


@route("GET", REPO + r"/pulls")
def _list_pulls(req: Request) -> tuple[int, Any]:
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


def _split_head(req: Request, full_name: str, head: str) -> tuple[str, str]:
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


@route("POST", REPO + r"/pulls")
def _create_pull(req: Request) -> tuple[int, Any]:
    s, full_name = req.server, req.full_name
    head, base = str(req.field("head")), str(req.field("base"))
    req.field("title")
    head_repo, ref = _split_head(req, full_name, head)
    if head_repo not in s.repos:
        raise validation(field_name="head", code="invalid")
    for pr in s.pulls[full_name].values():
        s.refresh(full_name, pr)
        if (pr["state"] == "open" and pr["head_repo"] == head_repo and pr["head_ref"] == ref
                and pr["base_ref"] == base):
            owner = head_repo.split("/", 1)[0]
            raise validation(f"A pull request already exists for {owner}:{ref}.")
    head_sha = s.branch_sha(s.repos[head_repo], ref)
    base_sha = s.branch_sha(s.repos[full_name], base)
    if head_sha is None:
        raise validation(field_name="head", code="invalid")
    if base_sha is None:
        raise validation(field_name="base", code="invalid")
    if head_sha == base_sha:
        raise validation(f"No commits between {base} and {ref}")
    pr = s.add_pull(full_name, head=ref, base=base, title=str(req.body["title"]),
                    body=str(req.body.get("body") or ""), user=s.login,
                    draft=bool(req.body.get("draft", False)), head_repo=head_repo,
                    head_sha=head_sha)
    return 201, req.render.pull(full_name, pr)


@route("GET", REPO + r"/pulls/(?P<number>\d+)")
def _get_pull(req: Request) -> tuple[int, Any]:
    return 200, req.render.pull(req.full_name, req.pull())


@route("PATCH", REPO + r"/pulls/(?P<number>\d+)")
def _edit_pull(req: Request) -> tuple[int, Any]:
    pr = req.pull()
    body = req.body if isinstance(req.body, dict) else {}
    for key in ("title", "body"):
        if key in body:
            pr[key] = body[key]
    if body.get("state") in ("open", "closed"):
        pr["state"] = body["state"]
        pr["closed_at"] = NOW if body["state"] == "closed" else None
    if "base" in body:
        pr["base_ref"] = body["base"]
    pr["updated_at"] = NOW
    return 200, req.render.pull(req.full_name, pr)


@route("POST", r"/graphql")
def _graphql(req: Request) -> tuple[int, Any]:
    """The one mutation kfbot sends: turning an open pull request into a draft."""
    query = req.body.get("query", "") if isinstance(req.body, dict) else ""
    if "convertPullRequestToDraft" not in query:
        return 200, {"errors": [{"message": "the fake answers convertPullRequestToDraft only"}]}
    node = str(req.body.get("variables", {}).get("input", {}).get("pullRequestId", ""))
    for pulls in req.server.pulls.values():
        for pr in pulls.values():
            if f"PR_{pr['id']}" == node:
                pr["draft"] = True
                pr["updated_at"] = NOW
                return 200, {"data": {"convertPullRequestToDraft": {
                    "clientMutationId": None, "pullRequest": {"isDraft": True}}}}
    return 200, {"errors": [{"message": f"no pull request with id {node}"}]}


@route("GET", REPO + r"/pulls/(?P<number>\d+)/commits")
def _pull_commits(req: Request) -> tuple[int, Any]:
    full_name, pr = req.full_name, req.pull()
    req.server.refresh(full_name, pr)
    return 200, [req.render.commit(full_name, c) for c in req.server.pr_commits(full_name, pr)]


@route("GET", REPO + r"/issues/(?P<number>\d+)")
def _get_issue(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    return 200, req.render.issue(req.full_name, req.number)


def _record(req: Request) -> JSON:
    full_name = req.full_name
    pr = req.server.pulls[full_name].get(req.number)
    return pr if pr is not None else req.server.issues[full_name][req.number]


@route("PATCH", REPO + r"/issues/(?P<number>\d+)")
def _edit_issue(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    record, body = _record(req), req.body if isinstance(req.body, dict) else {}
    for key in ("title", "body", "state"):
        if key in body:
            record[key] = body[key]
    if "labels" in body:
        record["labels"] = [str(name) for name in body["labels"]]
    return 200, req.render.issue(req.full_name, req.number)


@route("GET", REPO + r"/issues/(?P<number>\d+)/comments")
def _list_comments(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    comments = req.server.comments_on(req.full_name, req.number)
    return 200, [req.render.comment(c) for c in comments]


@route("POST", REPO + r"/issues/(?P<number>\d+)/comments")
def _create_comment(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    s = req.server
    comment = s.add_comment(req.full_name, req.number, str(req.field("body")), user=s.login,
                            user_type="Bot" if s.login.endswith("[bot]") else "User",
                            association="NONE")
    return 201, req.render.comment(comment)


@route("GET", REPO + r"/issues/comments/(?P<id>\d+)")
def _get_comment(req: Request) -> tuple[int, Any]:
    return 200, req.render.comment(req.comment())


@route("PATCH", REPO + r"/issues/comments/(?P<id>\d+)")
def _edit_comment(req: Request) -> tuple[int, Any]:
    comment = req.comment()
    comment["body"] = str(req.field("body"))
    comment["updated_at"] = NOW
    return 200, req.render.comment(comment)


@route("DELETE", REPO + r"/issues/comments/(?P<id>\d+)")
def _delete_comment(req: Request) -> tuple[int, Any]:
    req.server.comments.pop(req.comment()["id"])
    return 204, None


def _add_reaction(req: Request, reactions: list[JSON]) -> tuple[int, Any]:
    content = req.field("content")
    if content not in REACTIONS:
        raise validation(field_name="content", code="invalid", resource="Reaction")
    for reaction in reactions:
        if reaction["user"] == req.server.login and reaction["content"] == content:
            return 200, req.render.reaction(reaction)
    reaction = {"id": req.server.new_id(), "user": req.server.login, "content": content}
    reactions.append(reaction)
    return 201, req.render.reaction(reaction)


@route("POST", REPO + r"/issues/comments/(?P<id>\d+)/reactions")
def _react_comment(req: Request) -> tuple[int, Any]:
    return _add_reaction(req, req.server.reactions.setdefault(req.comment()["id"], []))


@route("GET", REPO + r"/issues/comments/(?P<id>\d+)/reactions")
def _comment_reactions(req: Request) -> tuple[int, Any]:
    reactions = req.server.reactions.get(req.comment()["id"], [])
    return 200, [req.render.reaction(r) for r in reactions]


@route("POST", REPO + r"/issues/(?P<number>\d+)/reactions")
def _react_issue(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    key = (req.full_name, req.number)
    return _add_reaction(req, req.server.issue_reactions.setdefault(key, []))


@route("GET", REPO + r"/issues/(?P<number>\d+)/reactions")
def _issue_reactions(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    reactions = req.server.issue_reactions.get((req.full_name, req.number), [])
    return 200, [req.render.reaction(r) for r in reactions]


def _label_names(body: Any) -> list[str]:
    names = body.get("labels") if isinstance(body, dict) else body
    if not isinstance(names, list):
        raise validation(field_name="labels", code="invalid", resource="Label")
    return [str(n["name"]) if isinstance(n, dict) else str(n) for n in names]


@route("POST", REPO + r"/issues/(?P<number>\d+)/labels")
def _add_labels(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    record = _record(req)
    for name in _label_names(req.body):
        if name not in record["labels"]:
            record["labels"].append(name)
    return 200, [req.render.label(req.full_name, name) for name in record["labels"]]


@route("PUT", REPO + r"/issues/(?P<number>\d+)/labels")
def _set_labels(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    record = _record(req)
    record["labels"] = _label_names(req.body)
    return 200, [req.render.label(req.full_name, name) for name in record["labels"]]


@route("GET", REPO + r"/issues/(?P<number>\d+)/labels")
def _get_labels(req: Request) -> tuple[int, Any]:
    req.issue_exists()
    return 200, [req.render.label(req.full_name, name) for name in _record(req)["labels"]]


@route("GET", REPO + r"/collaborators/(?P<user>[^/]+)/permission")
def _permission(req: Request) -> tuple[int, Any]:
    user = req.params["user"]
    permission = req.server.permissions.get((req.full_name, user))
    if permission is None:
        raise Reply(404, error_body(404, "Not Found"))
    return 200, {"permission": PERMISSION_FIELD[permission],
                 "role_name": ROLE_NAMES[permission], "user": req.render.user(user)}


@route("GET", REPO + r"/contents/(?P<path>.+)")
def _get_contents(req: Request) -> tuple[int, Any]:
    """A file of a linked repository (`link_remote`) at `?ref=` (default: default branch)."""
    import base64
    import hashlib

    repo = req.server.repos[req.full_name]
    path, ref = req.params["path"], req.query.get("ref") or repo.default_branch
    shown = subprocess.run(["git", "--git-dir", str(repo.bare), "show", f"{ref}:{path}"],
                           capture_output=True, check=False) if repo.bare else None
    if shown is None or shown.returncode != 0:
        raise Reply(404)
    url = f"{req.render.api}/repos/{req.full_name}/contents/{path}"
    html = f"https://github.com/{req.full_name}/blob/{ref}/{path}"
    return 200, {"type": "file", "encoding": "base64", "size": len(shown.stdout),
                 "name": path.rsplit("/", 1)[-1], "path": path, "url": url, "html_url": html,
                 "content": base64.b64encode(shown.stdout).decode(),
                 "sha": hashlib.sha1(b"blob %d\0" % len(shown.stdout) + shown.stdout).hexdigest(),
                 "git_url": None, "download_url": None, "_links": {"self": url, "html": html}}


@route("GET", REPO + r"/branches/(?P<branch>.+)")
def _get_branch(req: Request) -> tuple[int, Any]:
    full_name, name = req.full_name, req.params["branch"]
    sha = req.server.branch_sha(req.server.repos[full_name], name)
    if sha is None:
        raise Reply(404, error_body(404, "Branch not found"))
    return 200, req.render.branch(full_name, name, sha)


@route("GET", REPO + r"/git/ref/heads/(?P<branch>.+)")
def _get_ref(req: Request) -> tuple[int, Any]:
    full_name, name = req.full_name, req.params["branch"]
    sha = req.server.branch_sha(req.server.repos[full_name], name)
    if sha is None:
        raise Reply(404)
    return 200, req.render.ref(full_name, name, sha)


@route("GET", REPO + r"/git/refs/heads/(?P<branch>.+)")
def _get_refs(req: Request) -> tuple[int, Any]:
    return _get_ref(req)


@route("DELETE", REPO + r"/git/refs/heads/(?P<branch>.+)")
def _delete_ref(req: Request) -> tuple[int, Any]:
    repo = req.server.repos[req.full_name]
    if req.server.branch_sha(repo, req.params["branch"]) is None:
        raise Reply(422, error_body(422, "Reference does not exist"))
    req.server.delete_branch(repo, req.params["branch"])
    return 204, None
