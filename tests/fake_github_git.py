"""The fake GitHub server's Git Data API (fake_github.py), on the repository's linked bare
git repository: every object it reads or makes is a real git object there."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from fake_github_records import JSON, NOW, Reply, error_body, validation
from fake_github_rest import REPO, Request, Routes, router

ROUTES: Routes = []  # the Git Data endpoints, matched after the REST ones
route = router(ROUTES)


def _bare(req: Request) -> Path:
    bare = req.server.repos[req.full_name].bare
    if bare is None:
        raise Reply(409, error_body(409, "Git Repository is empty."))
    return bare


def _git_out(bare: Path, *args: str, data: bytes | None = None,
             env: dict[str, str] | None = None, missing: int = 404) -> bytes:
    """git in the bare repository; a failure is answered as GitHub would (404 or 422)."""
    done = subprocess.run(["git", "--git-dir", str(bare), *args], input=data,
                          capture_output=True, check=False, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise Reply(missing, error_body(missing, "Not Found" if missing == 404 else
                                          done.stderr.decode(errors="replace").strip()[:200]))
    return done.stdout


def _object_type(bare: Path, sha: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        return ""
    done = subprocess.run(["git", "--git-dir", str(bare), "cat-file", "-t", sha],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def _git_commit_json(req: Request, sha: str) -> JSON:
    bare, api = _bare(req), f"{req.render.api}/repos/{req.full_name}"
    if _object_type(bare, sha) != "commit":
        raise Reply(404)
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


def _tree_json(req: Request, sha: str, recursive: bool) -> JSON:
    bare, api = _bare(req), f"{req.render.api}/repos/{req.full_name}"
    if _object_type(bare, sha) != "tree":
        raise Reply(404)
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


@route("GET", REPO + r"/git/commits/(?P<sha>[0-9a-f]+)")
def _get_git_commit(req: Request) -> tuple[int, Any]:
    return 200, _git_commit_json(req, req.params["sha"])


@route("GET", REPO + r"/git/trees/(?P<sha>[0-9a-f]+)")
def _get_tree(req: Request) -> tuple[int, Any]:
    return 200, _tree_json(req, req.params["sha"], req.query.get("recursive") not in
                           (None, "", "0", "false"))


@route("GET", REPO + r"/git/blobs/(?P<sha>[0-9a-f]+)")
def _get_blob(req: Request) -> tuple[int, Any]:
    import base64

    bare, sha = _bare(req), req.params["sha"]
    if _object_type(bare, sha) != "blob":
        raise Reply(404)
    data = _git_out(bare, "cat-file", "blob", sha)
    encoded = base64.b64encode(data).decode()
    lines = "\n".join(encoded[i:i + 60] for i in range(0, len(encoded), 60))
    return 200, {"sha": sha, "node_id": f"B_{sha}", "size": len(data), "encoding": "base64",
                 "content": lines + "\n",
                 "url": f"{req.render.api}/repos/{req.full_name}/git/blobs/{sha}"}


@route("POST", REPO + r"/git/blobs")
def _create_blob(req: Request) -> tuple[int, Any]:
    import base64
    import binascii

    content, encoding = req.field("content"), req.body.get("encoding", "utf-8")
    if not isinstance(content, str) or encoding not in ("utf-8", "base64"):
        raise validation(field_name="encoding", code="invalid", resource="Blob")
    try:
        data = base64.b64decode(content, validate=True) if encoding == "base64" \
            else content.encode()
    except binascii.Error:
        raise validation("content is not valid Base64", resource="Blob") from None
    sha = _git_out(_bare(req), "hash-object", "-w", "--stdin", data=data).decode().strip()
    return 201, {"sha": sha, "url": f"{req.render.api}/repos/{req.full_name}/git/blobs/{sha}"}


@route("POST", REPO + r"/git/trees")
def _create_tree(req: Request) -> tuple[int, Any]:
    """GitHub's tree creation: entries on top of `base_tree`, nested paths made as trees."""
    import tempfile

    bare, entries = _bare(req), req.field("tree")
    base = req.body.get("base_tree")
    with tempfile.TemporaryDirectory(prefix="fake-github-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if base:
            if _object_type(bare, str(base)) != "tree":
                raise validation("base_tree is not a valid tree oid", resource="Tree")
            _git_out(bare, "read-tree", str(base), env=env)
        for entry in entries:
            path, mode, sha = str(entry.get("path", "")), str(entry.get("mode", "")), \
                entry.get("sha")
            if mode not in ("100644", "100755", "040000", "160000", "120000") or not path:
                raise validation("tree.mode or tree.path is invalid", resource="Tree")
            if "content" in entry:
                sha = _git_out(bare, "hash-object", "-w", "--stdin",
                               data=str(entry["content"]).encode()).decode().strip()
            if sha is None:
                _git_out(bare, "update-index", "--force-remove", "--", path, env=env,
                         missing=422)
                continue
            if _object_type(bare, str(sha)) not in ("blob", "commit"):
                raise validation(f"tree.sha {sha} is not a valid blob", resource="Tree")
            _git_out(bare, "update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}",
                     env=env, missing=422)
        tree = _git_out(bare, "write-tree", env=env, missing=422).decode().strip()
    return 201, _tree_json(req, tree, False)


@route("POST", REPO + r"/git/commits")
def _create_git_commit(req: Request) -> tuple[int, Any]:
    bare, tree = _bare(req), str(req.field("tree"))
    message, parents = str(req.field("message")), req.body.get("parents") or []
    if _object_type(bare, tree) != "tree":
        raise validation("Tree SHA does not exist", resource="Commit")
    if any(_object_type(bare, str(p)) != "commit" for p in parents):
        raise validation("Parent SHA does not exist or is not a commit object",
                          resource="Commit")
    login = req.server.login
    author = req.body.get("author") or {"name": login, "email": f"{login}@users.noreply"}
    committer = req.body.get("committer") or author
    env = {"GIT_AUTHOR_NAME": author["name"], "GIT_AUTHOR_EMAIL": author["email"],
           "GIT_COMMITTER_NAME": committer["name"], "GIT_COMMITTER_EMAIL": committer["email"],
           "GIT_AUTHOR_DATE": NOW, "GIT_COMMITTER_DATE": NOW}
    args = ["commit-tree", tree, *[a for p in parents for a in ("-p", str(p))]]
    sha = _git_out(bare, *args, data=message.encode(), env=env, missing=422).decode().strip()
    return 201, _git_commit_json(req, sha)


@route("POST", REPO + r"/git/refs")
def _create_ref(req: Request) -> tuple[int, Any]:
    bare, ref, sha = _bare(req), str(req.field("ref")), str(req.field("sha"))
    if not ref.startswith("refs/") or ref.count("/") < 2:
        raise validation("Reference name is invalid", resource="Reference")
    if _object_type(bare, sha) != "commit":
        raise validation("Object does not exist", resource="Reference")
    exists = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "-q", ref],
                            capture_output=True, check=False).returncode == 0
    if exists:
        raise validation("Reference already exists", resource="Reference")
    _git_out(bare, "update-ref", ref, sha, "0" * 40, missing=422)
    name = ref.removeprefix("refs/heads/")
    return 201, req.render.ref(req.full_name, name, sha)


@route("PATCH", REPO + r"/git/refs/heads/(?P<branch>.+)")
def _update_ref(req: Request) -> tuple[int, Any]:
    bare, name, sha = _bare(req), req.params["branch"], str(req.field("sha"))
    old = req.server.branch_sha(req.server.repos[req.full_name], name)
    if old is None:
        raise Reply(422, error_body(422, "Reference does not exist"))
    if _object_type(bare, sha) != "commit":
        raise validation("Object does not exist", resource="Reference")
    fast_forward = subprocess.run(["git", "--git-dir", str(bare), "merge-base",
                                   "--is-ancestor", old, sha], check=False).returncode == 0
    if not fast_forward and not req.body.get("force"):
        raise Reply(422, error_body(422, "Update is not a fast forward"))
    _git_out(bare, "update-ref", f"refs/heads/{name}", sha, old, missing=422)
    return 200, req.render.ref(req.full_name, name, sha)


@route("GET", REPO + r"/compare/(?P<base>[^.]+)\.\.\.(?P<head>.+)")
def _compare(req: Request) -> tuple[int, Any]:
    bare, api = _bare(req), f"{req.render.api}/repos/{req.full_name}"
    repo = req.server.repos[req.full_name]
    ends = [req.server.branch_sha(repo, req.params[k]) or req.params[k] for k in ("base", "head")]
    if any(_object_type(bare, sha) != "commit" for sha in ends):
        raise Reply(404, error_body(404, "Not Found"))
    base, head = ends
    fork = _git_out(bare, "merge-base", base, head).decode().strip()
    ahead = _git_out(bare, "rev-list", "--reverse", head, f"^{fork}").decode().split()
    behind = _git_out(bare, "rev-list", base, f"^{fork}").decode().split()
    status = "identical" if not ahead and not behind else "ahead" if not behind else \
        "behind" if not ahead else "diverged"
    commits = [req.render.commit(req.full_name, req.server.git_commit(bare, sha))
               for sha in ahead]
    html = f"https://github.com/{req.full_name}/compare/{req.params['base']}...{req.params['head']}"
    return 200, {"url": f"{api}/compare/{req.params['base']}...{req.params['head']}",
                 "html_url": html, "permalink_url": html, "diff_url": f"{html}.diff",
                 "patch_url": f"{html}.patch", "status": status, "ahead_by": len(ahead),
                 "behind_by": len(behind), "total_commits": len(ahead), "commits": commits,
                 "files": [],
                 "base_commit": req.render.commit(req.full_name,
                                                  req.server.git_commit(bare, base)),
                 "merge_base_commit": req.render.commit(req.full_name,
                                                        req.server.git_commit(bare, fork))}
