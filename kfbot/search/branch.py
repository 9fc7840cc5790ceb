"""Commit a winning candidate without touching the working tree, and push it.

Every commit is made in a temporary git worktree, so the user's checkout, index and
uncommitted changes are never read from or written to; the worktree is removed
afterwards, whatever happens. `write_branch` commits on a new local branch from HEAD;
the publishing side (`remote_heads`, `fetch`, `commit_detached`, `push_with_lease`)
builds on the remote's base branch and pushes a detached commit, so no local branch or
remote-tracking ref is created either. Credentials for a push travel in the environment
of that one git command (`auth_env`), never in a URL or a config file.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot import git
from kfbot.errors import KfbotError
from kfbot.search.experience import DEFAULT_PATH, Lesson, append_lessons, read_lessons
from kfbot.text import write_source

_BAD_REF = re.compile(r"[^A-Za-z0-9._/-]+")
_BAD_COMPONENT = re.compile(r"[^A-Za-z0-9._-]+")
TRAILER = "Kfbot-Kernel"  # in every commit kfbot makes for a pull request: whose it is
_FALLBACK_IDENTITY = {"GIT_AUTHOR_NAME": "kfbot", "GIT_COMMITTER_NAME": "kfbot",
                      "GIT_AUTHOR_EMAIL": "kfbot@users.noreply.github.com",
                      "GIT_COMMITTER_EMAIL": "kfbot@users.noreply.github.com"}


def branch_name(kernel: str, short_hash: str) -> str:
    """`kfbot/softmax_kernel-1a2b3c4d5e`: a valid, readable ref name."""
    name = _BAD_REF.sub("-", kernel.rsplit("::", 1)[-1]).strip("-./") or "kernel"
    return f"kfbot/{name}-{short_hash}"


def write_branch(root: Path, files: Mapping[str, str], branch: str, message: str) -> str:
    """Commit `files` (repository-relative path -> new text) on a new branch from HEAD.

    Returns the commit's sha. The branch must not exist yet; the paths must stay
    inside the repository.
    """
    place = open_repo(root)
    if git.commit_of(place.top, f"refs/heads/{branch}") is not None:
        raise KfbotError(f"branch {branch} already exists in {place.top}")
    with tempfile.TemporaryDirectory(prefix="kfbot-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        git.run(place.top, "worktree", "add", "--quiet", "-b", branch, str(tree), "HEAD")
        committed = False
        try:
            paths = _write_files(tree, place.rel_root, files)
            git.run(tree, "add", "--", *paths)
            if not git.succeeds(tree, "diff", "--cached", "--quiet"):
                git.run(tree, "commit", "--quiet", "--no-verify", "-m", message,
                        env=_identity(place.top))
                committed = True
                return git.text(tree, "rev-parse", "HEAD")
            raise KfbotError("the candidate changes nothing against HEAD")
        finally:
            git.run(place.top, "worktree", "remove", "--force", str(tree))
            if not committed:  # leave no empty branch behind
                git.run(place.top, "branch", "-D", branch)


def open_repo(root: Path) -> git.Place:
    """The working tree holding `root`; it must have a commit to branch from."""
    place = git.locate(root)
    if git.commit_of(place.top, "HEAD") is None:
        raise KfbotError(f"{root}: the repository has no commit to branch from")
    return place


# ---- publishing: detached commits on the remote's base, pushed with a lease ------------


@dataclass(frozen=True)
class Commit:
    sha: str
    tree: str
    lessons_added: tuple[Lesson, ...]  # lessons the experience file did not hold yet


def pr_branch(kernel_id: str) -> str:
    """`kfbot/csrc-softmax.cu-softmax_kernel`: one branch per kernel, the same every run."""
    flat = _BAD_COMPONENT.sub("-", kernel_id.replace("::", "-").replace("/", "-"))
    flat = re.sub(r"\.{2,}", ".", re.sub(r"-{2,}", "-", flat)).strip("-.")
    flat = flat.removesuffix(".lock")[:120].strip("-.") or "kernel"
    return f"kfbot/{flat}"


def remote_url(top: Path, remote: str, push: bool = False) -> str:
    """The remote's fetch (or push) URL as configured (git applies `insteadOf` when it
    uses it). kfbot fetches and pushes by URL, not by remote name, so that git updates
    none of the user's remote-tracking refs."""
    keys = (f"remote.{remote}.pushurl", f"remote.{remote}.url") if push else \
        (f"remote.{remote}.url",)
    for key in keys:
        value = git.config_value(top, key)
        if value:
            return value
    raise KfbotError(f"{top}: no git remote named {remote!r} (set it with --remote)")


def auth_env(url: str, token: str | None) -> dict[str, str]:
    """Environment for one git command that authenticates to an https remote with `token`.

    The header replaces any extra header configured for that host (actions/checkout
    leaves one), and lives only in the environment of that command.
    """
    env = {"GIT_TERMINAL_PROMPT": "0"}
    parts = urllib.parse.urlsplit(url)
    if not token or parts.scheme != "https" or not parts.hostname:
        return env
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    key = f"http.https://{parts.hostname}/.extraheader"
    return {**env, "GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": key, "GIT_CONFIG_VALUE_0": "",
            "GIT_CONFIG_KEY_1": key, "GIT_CONFIG_VALUE_1": f"AUTHORIZATION: basic {basic}"}


def remote_heads(top: Path, url: str, branches: Sequence[str],
                 env: Mapping[str, str]) -> dict[str, str]:
    """branch -> sha on the remote at `url`, for those of `branches` that exist there."""
    out = git.text(top, "ls-remote", "--heads", url, *[f"refs/heads/{b}" for b in branches],
                   env=env)
    heads = {}
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        heads[ref.removeprefix("refs/heads/")] = sha
    return {b: heads[b] for b in branches if b in heads}


def fetch(top: Path, url: str, branch: str, env: Mapping[str, str]) -> str:
    """Fetch `branch` from the remote at `url` and return its sha; no ref is left behind."""
    scratch = f"refs/kfbot/fetch-{secrets.token_hex(6)}"
    git.run(top, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url,
            f"+refs/heads/{branch}:{scratch}", env=env)
    try:
        return git.text(top, "rev-parse", scratch)
    finally:
        git.run(top, "update-ref", "-d", scratch)


def local_base(top: Path, remote: str, branch: str | None) -> tuple[str, str]:
    """Without the network: the base branch's name and sha as this clone last saw them."""
    if branch is None:
        if git.succeeds(top, "symbolic-ref", "--quiet", f"refs/remotes/{remote}/HEAD"):
            ref = git.text(top, "symbolic-ref", f"refs/remotes/{remote}/HEAD")
            branch = ref.removeprefix(f"refs/remotes/{remote}/")
        else:  # the checked-out branch; "HEAD" when detached
            branch = git.text(top, "rev-parse", "--abbrev-ref", "HEAD")
    for ref in (f"refs/remotes/{remote}/{branch}", f"refs/heads/{branch}", branch):
        sha = git.commit_of(top, ref)
        if sha is not None:
            return branch, sha
    raise KfbotError(f"{top}: no branch {branch!r} to compare against "
                     "(set github.base in the config)")


def commit_detached(place: git.Place, base: str, files: Mapping[str, str], message: str,
                    lessons: Sequence[Lesson] = ()) -> Commit:
    """Commit `files` (paths relative to `place`'s folder) and `lessons` on top of `base`.

    The commit is on no branch: the caller pushes it. The lessons are appended to the
    experience file as `base` has it, so the user's copy is never read.
    """
    with tempfile.TemporaryDirectory(prefix="kfbot-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        git.run(place.top, "worktree", "add", "--quiet", "--detach", str(tree), base)
        try:
            paths = _write_files(tree, place.rel_root, files)
            added = _add_lessons(tree / place.rel_root / DEFAULT_PATH, lessons)
            if added:
                paths.append(str(place.rel_root / DEFAULT_PATH))
            git.run(tree, "add", "--force", "--", *paths)  # `.kfbot/` is often git-ignored
            if git.succeeds(tree, "diff", "--cached", "--quiet"):
                raise KfbotError("the candidate changes nothing against the base branch")
            git.run(tree, "commit", "--quiet", "--no-verify", "-m", message,
                    env=_identity(place.top))
            sha = git.text(tree, "rev-parse", "HEAD")
            return Commit(sha, tree_of(place.top, sha), added)
        finally:
            git.run(place.top, "worktree", "remove", "--force", str(tree))


def tree_of(top: Path, sha: str) -> str:
    return git.text(top, "rev-parse", f"{sha}^{{tree}}")


def diff(top: Path, old: str, new: str) -> str:
    return git.run(top, "diff", "--no-ext-diff", "--no-color", old, new).decode(
        errors="replace").rstrip("\n") + "\n"


def foreign_commits(top: Path, base: str, head: str, kernel_id: str) -> list[str]:
    """Commits on `head` since it left `base` that kfbot did not make for `kernel_id`."""
    fork = git.text(top, "merge-base", base, head)
    out = git.text(top, "log", f"--format=%H%x01%(trailers:key={TRAILER},valueonly)%x02",
                   f"{fork}..{head}")
    found = []
    for record in out.split("\x02"):
        sha, _, kernels = record.strip().partition("\x01")
        if sha and kernel_id not in kernels.split("\n"):
            found.append(sha)
    return found


def push_with_lease(top: Path, url: str, sha: str, branch: str, expected: str | None,
                    env: Mapping[str, str]) -> bool:
    """Push `sha` to `branch` at `url` only if it is still at `expected` (None: absent).

    False when the branch moved meanwhile (the lease was stale): nothing is overwritten.
    """
    try:
        git.run(top, "push", "--quiet", "--no-verify", url, f"{sha}:refs/heads/{branch}",
                f"--force-with-lease=refs/heads/{branch}:{expected or ''}", env=env)
    except git.GitError as exc:
        if "stale info" in str(exc) or "fetch first" in str(exc) or "rejected" in str(exc):
            return False
        raise
    return True


def _write_files(tree: Path, rel_root: Path, files: Mapping[str, str]) -> list[str]:
    paths = []
    top = tree.resolve()
    for rel, text in sorted(files.items()):
        target = (tree / rel_root / rel).resolve()
        if not target.is_relative_to(top) or ".git" in target.relative_to(top).parts:
            raise KfbotError(f"{rel}: outside the repository")
        target.parent.mkdir(parents=True, exist_ok=True)
        write_source(target, text)
        paths.append(str(target.relative_to(top)))
    return paths


def _add_lessons(path: Path, lessons: Sequence[Lesson]) -> tuple[Lesson, ...]:
    if not lessons:
        return ()
    before = set(read_lessons(path)) if path.is_file() else set()
    append_lessons(path, lessons)
    return tuple(lesson for lesson in lessons if lesson not in before)


def _identity(top: Path) -> dict[str, str]:
    """The user's git identity when there is one, else kfbot's (CI runners often have none)."""
    if os.environ.get("GIT_AUTHOR_EMAIL") or os.environ.get("EMAIL"):
        return {}
    if git.config_value(top, "user.email"):
        return {}
    return dict(_FALLBACK_IDENTITY)


_REVERTS = re.compile(r"This reverts commit ([0-9a-f]{7,40})")
_CANDIDATE_LINE = re.compile(r"^(?:Kfbot-Candidate|Candidate): ([0-9a-f]{16,64})\s*$", re.M)


def reverted_candidates(root: Path) -> dict[str, str]:
    """The candidates whose kfbot commit a commit of HEAD's history reverted (`git
    revert` writes "This reverts commit <sha>"): candidate hash -> the revert's sha. A
    kfbot commit names its candidate in a `Kfbot-Candidate:` (pull request) or
    `Candidate:` (local branch) line."""
    place = git.locate(root)
    log = git.text(place.top, "log", "--format=%H%x1f%B%x1e", "HEAD")
    found: dict[str, str] = {}
    for entry in log.split("\x1e"):
        sha, _, body = entry.strip().partition("\x1f")
        for target in _REVERTS.findall(body):
            try:
                message = git.text(place.top, "log", "-1", "--format=%B", target)
            except git.GitError:
                continue  # a revert of a commit this clone does not have
            for digest in _CANDIDATE_LINE.findall(message):
                found.setdefault(digest, sha)
    return found
