"""Who may command kfbot, and on which commit: permission, fork policy, the pinned head.

The commenter's permission comes from the collaborator-permission endpoint, never from
the comment's `author_association` (which says how someone relates to the repository,
not what they may do in it), and the policy (the least permission, whether forks are
obeyed) is read from the config on the default branch: a pull request must not be able
to relax the rules it is judged by. The pull request's head commit is read once when the
command is authorized and pinned: the checkout must be that commit, and it is read
again before anything is published, so a push after the command cannot slip new code
under a maintainer's approval.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from github.PullRequest import PullRequest
from github.Repository import Repository

from kfbot.config import CONFIG_NAMES, PERMISSIONS, GithubConfig, load_config
from kfbot.errors import EXIT_FAILURE, KfbotError
from kfbot.github.api import DEFAULT_RETRY, GitHubError, Retry, call
from kfbot.scan.changes import resolve_base

RANK = {name: rank for rank, name in enumerate(PERMISSIONS)}  # read < ... < admin


class Refused(KfbotError):
    """The command was understood but is not allowed: not authorized, or a fork."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_FAILURE)


class HeadMoved(KfbotError):
    """The pull request is no longer at the commit the command was authorized for."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_FAILURE)


@dataclass(frozen=True)
class Head:
    """A pull request's head, pinned when the command was authorized."""

    number: int
    sha: str
    ref: str
    repository: str | None  # where the head branch lives; None when the fork is gone
    base_ref: str
    fork: bool

    @property
    def short(self) -> str:
        return self.sha[:7]


def permission(repo: Repository, login: str, retry: Retry = DEFAULT_RETRY) -> str:
    """The user's role in the repository (read ... admin), or "none"."""
    try:
        role = call(lambda: repo.get_collaborator_role_name(login),
                    f"reading @{login}'s permission", retry)
    except GitHubError as exc:
        if exc.status == 404:  # not a collaborator at all
            return "none"
        raise
    if role in RANK or role == "none":
        return role
    # A custom organisation role: its base permission is in the older field.
    return call(lambda: repo.get_collaborator_permission(login),
                f"reading @{login}'s permission", retry)


def authorize(repo: Repository, login: str, minimum: str, retry: Retry = DEFAULT_RETRY) -> str:
    """@login's permission when it is at least `minimum`, else Refused."""
    have = permission(repo, login, retry)
    if RANK.get(have, -1) < RANK[minimum]:
        raise Refused(f"@{login} is not authorized: `/kfbot` commands need `{minimum}` "
                      f"permission on the repository, and @{login} has `{have}`")
    return have


def read_head(repo: Repository, number: int, retry: Retry = DEFAULT_RETRY) -> Head:
    pr: PullRequest = call(lambda: repo.get_pull(number), f"reading pull request #{number}",
                           retry)
    if pr.state != "open":
        raise HeadMoved(f"pull request #{number} is {pr.state} (or its head branch was "
                        "deleted); nothing was run")
    head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
    return Head(number, pr.head.sha, pr.head.ref, head_repo, pr.base.ref,
                fork=head_repo != repo.full_name)


def pin_head(repo: Repository, number: int, github: GithubConfig, sha: str | None,
             retry: Retry = DEFAULT_RETRY) -> Head:
    """The head to run on, after the fork policy and the `sha=` the comment named."""
    head = read_head(repo, number, retry)
    if head.fork and not github.allow_forks:
        raise Refused(f"pull request #{number} comes from a fork "
                      f"({head.repository or 'a deleted repository'}); kfbot does not run "
                      "code from forks unless the config sets `github.allow_forks: true`")
    if head.fork and sha is None:
        raise Refused(f"pull request #{number} comes from a fork: name the exact commit to "
                      f"run, `sha={head.sha}`, after reviewing it")
    if sha is not None and sha != head.sha:
        raise HeadMoved(f"the command names commit {sha[:7]}, but the head of pull request "
                        f"#{number} is {head.short}; review the new commits and comment again")
    return head


def check_head(repo: Repository, pinned: Head, retry: Retry = DEFAULT_RETRY) -> None:
    """Read the pull request again: HeadMoved unless it is still at the pinned commit."""
    now = read_head(repo, pinned.number, retry)
    if now.sha != pinned.sha:
        raise HeadMoved(f"the head of pull request #{pinned.number} moved from {pinned.short} "
                        f"to {now.short} after the command was authorized; nothing was "
                        "published: comment again to run on the new head")


def check_checkout(root: Path, pinned: Head) -> None:
    """The checkout kfbot is about to read or run must be the pinned commit."""
    at = resolve_base(root, "HEAD")
    if at != pinned.sha:
        shown = at[:7] if at else "no commit"
        raise HeadMoved(f"the checkout is at {shown}, not at the head of pull request "
                        f"#{pinned.number} ({pinned.short}): the head moved after the "
                        "workflow started, or the workflow checks out another commit "
                        f"(check out refs/pull/{pinned.number}/head); comment again")


def policy_on_default_branch(repo: Repository, config_path: str | None = None,
                             retry: Retry = DEFAULT_RETRY) -> GithubConfig:
    """The config's `github` section as committed on the default branch (defaults if none)."""
    branch = repo.default_branch
    names = (config_path,) if config_path else CONFIG_NAMES
    with tempfile.TemporaryDirectory(prefix="kfbot-policy-") as tmp:
        folder = Path(tmp)
        found = False
        for name in names:
            text = _file_at(repo, name, branch, retry)
            if text is not None:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(text, encoding="utf-8")
                found = True
        if not found:
            return GithubConfig()
        try:
            return load_config(folder / config_path if config_path else None, folder).github
        except KfbotError as exc:
            raise KfbotError(f"the kfbot config on the default branch ({branch}): {exc}"
                             ) from None


def _file_at(repo: Repository, path: str, ref: str, retry: Retry) -> str | None:
    try:
        content = call(lambda: repo.get_contents(path, ref=ref), f"reading {path} on {ref}",
                       retry)
    except GitHubError as exc:
        if exc.status == 404:
            return None
        raise
    if isinstance(content, list):  # a folder of that name
        return None
    return content.decoded_content.decode("utf-8-sig")
