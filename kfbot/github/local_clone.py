"""Publishing from a person's own clone (`kfbot optimize --publish`): git, not the API.

The winner is committed in a temporary worktree on top of the remote's base branch and
pushed to its branch with `--force-with-lease`, so the user's checkout is never touched
and a branch that moved is never overwritten. The token goes only to the repository
being published to, on its GitHub host, in the environment of the one git command that
needs it. This trusts the clone's `.git` (its filters and its config are the user's
own); the GitHub Action's publish job uses the Git Data API instead (`gitdata`).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot import git
from kfbot.errors import KfbotError
from kfbot.github.api import api_url
from kfbot.search.branch import (
    Commit,
    auth_env,
    commit_detached,
    fetch,
    foreign_commits,
    open_repo,
    push_with_lease,
    remote_heads,
    remote_url,
    tree_of,
)
from kfbot.search.experience import Lesson

_SLUG_IN_PATH = re.compile(r"/?(?P<slug>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?/?")


@dataclass(frozen=True)
class Remote:
    """Where a clone publishes: its remote's URLs, the repository they name, and what a
    checkout step left in `.git/config` for a person to act on."""

    name: str  # as `git remote` knows it
    slug: str
    fetch_url: str
    push_url: str
    warnings: tuple[str, ...]


class LocalClone:
    """The branch side of publishing, done with git in the clone holding `root`."""

    def __init__(self, root: Path, remote: Remote, token: str) -> None:
        self.place = open_repo(root)
        self.top = self.place.top
        self.remote = remote
        self.git_env = auth_env(remote.fetch_url, token)
        self.push_env = auth_env(remote.push_url, token)

    def state(self, base: str, branch: str) -> tuple[str, str | None]:
        """The base branch's sha and the kfbot branch's (None: absent), both fetched."""
        heads = remote_heads(self.top, self.remote.fetch_url, [base, branch], self.git_env)
        if base not in heads:
            raise KfbotError(f"the remote {self.remote.name!r} has no branch {base!r} to "
                             "open the pull request against (github.base)")
        base_sha = fetch(self.top, self.remote.fetch_url, base, self.git_env)
        remote_sha = heads.get(branch)
        if remote_sha is not None:
            remote_sha = fetch(self.top, self.remote.fetch_url, branch, self.git_env)
        return base_sha, remote_sha

    def foreign(self, base_sha: str, head: str, kernel_id: str) -> list[str]:
        return foreign_commits(self.top, base_sha, head, kernel_id)

    def commit(self, base_sha: str, files: Mapping[str, str], message: str,
               lessons: Sequence[Lesson]) -> Commit:
        return commit_detached(self.place, base_sha, files, message, lessons)

    def tree(self, sha: str) -> str:
        return tree_of(self.top, sha)

    def move(self, branch: str, sha: str, expected: str | None) -> bool:
        return push_with_lease(self.top, self.remote.push_url, sha, branch, expected,
                               self.push_env)


def find_remote(root: Path, remote: str, slug: str | None, base_url: str | None,
                env: Mapping[str, str]) -> Remote:
    """The remote's URLs, checked to lead to `slug` (default: named by the URL)."""
    top = open_repo(root).top
    url = remote_url(top, remote)
    push_url = remote_url(top, remote, push=True)
    slug = slug or slug_of(url) or env.get("GITHUB_REPOSITORY")
    if not slug:
        raise KfbotError(f"cannot tell the GitHub repository from remote {remote!r} "
                         f"({safe_url(url)}); pass --repo-slug owner/name")
    host = _server_host(base_url, env)
    for target in dict.fromkeys((url, push_url)):
        _check_remote(top, remote, target, slug, host)
    return Remote(remote, slug, url, push_url, _credential_warnings(top))


def slug_of(url: str) -> str | None:
    """`owner/name` from a GitHub remote URL (https, ssh or scp-like), or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("https", "http", "ssh", "git"):
        path = parts.path
    elif "://" not in url and re.match(r"[^/:]+:", url):  # git@github.com:owner/name.git
        path = url.split(":", 1)[1]
    else:
        return None  # a local path or file:// URL names no GitHub repository
    match = _SLUG_IN_PATH.fullmatch(path)
    return match["slug"] if match else None


def _server_host(base_url: str | None, env: Mapping[str, str]) -> str:
    """The GitHub web host pushes go to: the runner's GITHUB_SERVER_URL, else the API's."""
    server = env.get("GITHUB_SERVER_URL", "").strip()
    if server:
        return (urllib.parse.urlsplit(server).hostname or "github.com").lower()
    api = urllib.parse.urlsplit(api_url(base_url, env)).hostname or "api.github.com"
    return "github.com" if api.lower() == "api.github.com" else api.lower()


def _check_remote(top: Path, remote: str, url: str, slug: str, host: str) -> None:
    """The token goes only to the repository being published to, on its GitHub host.

    The remote is read from `.git/config`, which code run in the checkout could have
    changed (and `insteadOf` can rewrite where git really goes), so both the URL as
    configured and as git would use it must name `slug` on `host`. Local remotes (a path
    or file://) never get the token.
    """
    for target in dict.fromkeys((url, git.effective_url(top, url))):
        parts = urllib.parse.urlsplit(target)
        local = parts.scheme == "file" or (not parts.scheme and not _scp_like(target))
        if local:
            continue
        named = slug_of(target)
        target_host = (parts.hostname or target.split("@")[-1].split(":")[0]).lower()
        if named is None or named.lower() != slug.lower() or target_host != host:
            raise KfbotError(f"the remote {remote!r} leads to {safe_url(target)}, not to "
                             f"{slug} on {host}: kfbot sends its token only to the repository "
                             "it publishes to; check `git remote -v` and any url.*.insteadOf "
                             "settings in the checkout")


def _scp_like(url: str) -> bool:
    return "://" not in url and re.match(r"[^/:]+:", url) is not None


def _credential_warnings(top: Path) -> tuple[str, ...]:
    keys = git.credential_headers(top)
    if not keys:
        return ()
    return (f"{top}/.git/config holds a credential header ({', '.join(keys)}): any code run "
            "in this checkout can read it; check out with `persist-credentials: false`",)


def safe_url(url: str) -> str:
    """The URL without any user or password in it."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        return parts._replace(netloc=parts.hostname or "").geturl()
    return url
