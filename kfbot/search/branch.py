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

import git

from kfbot.errors import EXIT_FAILURE, KfbotError
from kfbot.search.experience import DEFAULT_PATH, Lesson, append_lessons, read_lessons

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

    Returns the commit's hexsha. The branch must not exist yet; the paths must stay
    inside the repository.
    """
    repo = _repo(root)
    prefix = Path(repo.working_tree_dir or root).resolve()
    rel_root = root.resolve().relative_to(prefix)
    if branch in [h.name for h in repo.heads]:
        raise KfbotError(f"branch {branch} already exists in {prefix}")
    with tempfile.TemporaryDirectory(prefix="kfbot-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        repo.git.worktree("add", "--quiet", "-b", branch, str(tree), "HEAD")
        committed = False
        try:
            sha = _commit(git.Repo(tree), tree, rel_root, files, message)
            committed = True
            return sha
        finally:
            repo.git.worktree("remove", "--force", str(tree))
            if not committed:  # leave no empty branch behind
                repo.git.branch("-D", branch)


def _repo(root: Path) -> git.Repo:
    try:
        repo = git.Repo(root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise KfbotError(f"{root}: not inside a git repository") from exc
    if not repo.head.is_valid():
        raise KfbotError(f"{root}: the repository has no commit to branch from")
    return repo


def _commit(work: git.Repo, tree: Path, rel_root: Path, files: Mapping[str, str],
            message: str) -> str:
    paths = []
    for rel, text in sorted(files.items()):
        target = (tree / rel_root / rel).resolve()
        if not target.is_relative_to(tree.resolve()):
            raise KfbotError(f"{rel}: outside the repository")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        paths.append(str(target.relative_to(tree.resolve())))
    work.index.add(paths)
    if not work.index.diff("HEAD"):
        raise KfbotError("the candidate changes nothing against HEAD")
    commit = work.index.commit(message)  # the user's configured git identity
    return str(commit.hexsha)


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


def open_repo(root: Path) -> tuple[git.Repo, Path]:
    """The repository holding `root`, and `root` relative to its top folder."""
    repo = _repo(root)
    top = Path(repo.working_tree_dir or root).resolve()
    return repo, root.resolve().relative_to(top)


def remote_url(repo: git.Repo, remote: str, push: bool = False) -> str:
    """The remote's fetch (or push) URL as configured (git applies `insteadOf` when it
    uses it). kfbot fetches and pushes by URL, not by remote name, so that git updates
    none of the user's remote-tracking refs."""
    keys = (f"remote.{remote}.pushurl", f"remote.{remote}.url") if push else \
        (f"remote.{remote}.url",)
    for key in keys:
        try:
            return str(repo.git.config("--get", key))
        except git.GitCommandError:
            continue
    raise KfbotError(f"{repo.working_tree_dir}: no git remote named {remote!r} "
                     "(set it with --remote)")


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


def remote_heads(repo: git.Repo, url: str, branches: Sequence[str],
                 env: Mapping[str, str]) -> dict[str, str]:
    """branch -> sha on the remote at `url`, for those of `branches` that exist there."""
    out = _git(repo, env, "ls-remote", "--heads", url,
               *[f"refs/heads/{b}" for b in branches])
    heads = {}
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        heads[ref.removeprefix("refs/heads/")] = sha
    return {b: heads[b] for b in branches if b in heads}


def fetch(repo: git.Repo, url: str, branch: str, env: Mapping[str, str]) -> str:
    """Fetch `branch` from the remote at `url` and return its sha; no ref is left behind."""
    scratch = f"refs/kfbot/fetch-{secrets.token_hex(6)}"
    _git(repo, env, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url,
         f"+refs/heads/{branch}:{scratch}")
    try:
        return str(repo.git.rev_parse(scratch))
    finally:
        repo.git.update_ref("-d", scratch)


def local_base(repo: git.Repo, remote: str, branch: str | None) -> tuple[str, str]:
    """Without the network: the base branch's name and sha as this clone last saw them."""
    if branch is None:
        try:
            head = str(repo.git.symbolic_ref(f"refs/remotes/{remote}/HEAD"))
            branch = head.removeprefix(f"refs/remotes/{remote}/")
        except git.GitCommandError:
            branch = repo.active_branch.name if not repo.head.is_detached else "HEAD"
    for ref in (f"refs/remotes/{remote}/{branch}", f"refs/heads/{branch}", branch):
        try:
            return branch, str(repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}"))
        except git.GitCommandError:
            continue
    raise KfbotError(f"{repo.working_tree_dir}: no branch {branch!r} to compare against "
                     "(set github.base in the config)")


def commit_detached(repo: git.Repo, rel_root: Path, base: str, files: Mapping[str, str],
                    message: str, lessons: Sequence[Lesson] = ()) -> Commit:
    """Commit `files` (paths relative to `rel_root`) and `lessons` on top of `base`.

    The commit is on no branch: the caller pushes it. The lessons are appended to the
    experience file as `base` has it, so the user's copy is never read.
    """
    with tempfile.TemporaryDirectory(prefix="kfbot-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        repo.git.worktree("add", "--quiet", "--detach", str(tree), base)
        try:
            work = git.Repo(tree)
            paths = _write_files(tree, rel_root, files)
            added = _add_lessons(tree / rel_root / DEFAULT_PATH, lessons)
            if added:
                paths.append(str(rel_root / DEFAULT_PATH))
            work.git.add("--force", "--", *paths)  # `.kfbot/` is often git-ignored
            if not work.git.diff("--cached", "--name-only"):
                raise KfbotError("the candidate changes nothing against the base branch")
            _git(work, _identity(repo), "commit", "--quiet", "--no-verify", "-m", message)
            sha = str(work.git.rev_parse("HEAD"))
            return Commit(sha, tree_of(repo, sha), added)
        finally:
            repo.git.worktree("remove", "--force", str(tree))


def tree_of(repo: git.Repo, sha: str) -> str:
    return str(repo.git.rev_parse(f"{sha}^{{tree}}"))


def diff(repo: git.Repo, old: str, new: str) -> str:
    return str(repo.git.diff(old, new)) + "\n"


def foreign_commits(repo: git.Repo, base: str, head: str, kernel_id: str) -> list[str]:
    """Commits on `head` since it left `base` that kfbot did not make for `kernel_id`."""
    fork = str(repo.git.merge_base(base, head))
    out = str(repo.git.log(f"--format=%H%x01%(trailers:key={TRAILER},valueonly)%x02",
                           f"{fork}..{head}"))
    found = []
    for record in out.split("\x02"):
        sha, _, kernels = record.strip().partition("\x01")
        if sha and kernel_id not in kernels.split("\n"):
            found.append(sha)
    return found


def push_with_lease(repo: git.Repo, url: str, sha: str, branch: str, expected: str | None,
                    env: Mapping[str, str]) -> bool:
    """Push `sha` to `branch` at `url` only if it is still at `expected` (None: absent).

    False when the branch moved meanwhile (the lease was stale): nothing is overwritten.
    """
    try:
        _git(repo, env, "push", "--quiet", url, f"{sha}:refs/heads/{branch}",
             f"--force-with-lease=refs/heads/{branch}:{expected or ''}")
    except KfbotError as exc:
        if "stale info" in str(exc) or "fetch first" in str(exc):
            return False
        raise
    return True


def _git(repo: git.Repo, env: Mapping[str, str], *args: str) -> str:
    """Run git with `env` added; a failure says which command failed and why, credentials
    scrubbed."""
    try:
        return str(repo.git.execute(["git", *args], env={**os.environ, **env}))
    except git.GitCommandError as exc:
        said = " ".join(f"{exc.stderr or ''} {exc.stdout or ''}".split()) or str(exc)
        for value in env.values():
            if len(value) >= 8:
                said = said.replace(value, "***")
        raise KfbotError(f"git {args[0]} failed in {repo.working_tree_dir}: {said}",
                         EXIT_FAILURE) from None


def _write_files(tree: Path, rel_root: Path, files: Mapping[str, str]) -> list[str]:
    paths = []
    for rel, text in sorted(files.items()):
        target = (tree / rel_root / rel).resolve()
        if not target.is_relative_to(tree.resolve()) or ".git" in target.relative_to(
                tree.resolve()).parts:
            raise KfbotError(f"{rel}: outside the repository")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        paths.append(str(target.relative_to(tree.resolve())))
    return paths


def _add_lessons(path: Path, lessons: Sequence[Lesson]) -> tuple[Lesson, ...]:
    if not lessons:
        return ()
    before = set(read_lessons(path)) if path.is_file() else set()
    append_lessons(path, lessons)
    return tuple(lesson for lesson in lessons if lesson not in before)


def _identity(repo: git.Repo) -> dict[str, str]:
    """The user's git identity when there is one, else kfbot's (CI runners often have none)."""
    if os.environ.get("GIT_AUTHOR_EMAIL") or os.environ.get("EMAIL"):
        return {}
    with repo.config_reader() as cfg:
        if cfg.get_value("user", "email", ""):
            return {}
    return dict(_FALLBACK_IDENTITY)
