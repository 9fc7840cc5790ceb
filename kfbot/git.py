"""The one place kfbot runs git.

Every command runs as a subprocess (importing a git library costs the pre-commit hook a
tenth of a second) with a timeout, and with what a repository's own files could use to
run code in kfbot's name switched off: hooks (`core.hooksPath` points at a path that
cannot hold any: a planted `pre-push` hook would see the push token), credential
helpers kfbot did not set, and the file-system monitor command. A failure is a
`GitError` naming the command, its exit code and git's first line of complaint, with
anything that looks like a credential taken out.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.errors import EXIT_FAILURE, EXIT_MISSING_TOOL, EXIT_USAGE, KfbotError

TIMEOUT_S = 120.0
# `-c` settings on every command. /dev/null is not a folder, so no hook is ever found.
HARDENING = ("-c", "core.hooksPath=/dev/null", "-c", "credential.helper=",
             "-c", "core.fsmonitor=false", "--no-pager")
_HEADER = re.compile(r"^http\..*\.extraheader$", re.IGNORECASE)


class GitError(KfbotError):
    """A git command failed; the message says which, how, and where."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message, exit_code)


def run(cwd: Path, *args: str, stdin: bytes | None = None, env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT_S) -> bytes:
    """git `args` in `cwd`; its stdout. `env` adds variables to this process's own."""
    proc = _run(cwd, args, stdin, env, timeout)
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        first = said[0] if said else proc.stdout.decode(errors="replace").strip()[:200]
        raise GitError(_scrubbed(f"git {' '.join(args[:3])} failed in {cwd} "
                                 f"(exit {proc.returncode}): {first or 'no message'}", env))
    return proc.stdout


def text(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """git's stdout as text, surrounding whitespace removed."""
    return run(cwd, *args, env=env).decode(errors="replace").strip()


def succeeds(cwd: Path, *args: str) -> bool:
    """Whether git `args` exits 0 (for questions such as `rev-parse --verify`)."""
    return _run(cwd, args, None, None, TIMEOUT_S).returncode == 0


def _run(cwd: Path, args: Sequence[str], stdin: bytes | None, env: Mapping[str, str] | None,
         timeout: float) -> subprocess.CompletedProcess[bytes]:
    full_env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})}
    try:
        return subprocess.run(["git", *HARDENING, *args], cwd=cwd, input=stdin,
                              capture_output=True, env=full_env, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise GitError("git not found: install git or put it on PATH",
                       EXIT_MISSING_TOOL) from exc
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"git {' '.join(args[:3])} in {cwd} did not finish within "
                       f"{timeout:.0f} s") from exc


def _scrubbed(message: str, env: Mapping[str, str] | None) -> str:
    for value in (env or {}).values():
        if len(value) >= 8:
            message = message.replace(value, "***")
    return message


# ---- where a repository is --------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """A folder inside a git working tree."""

    top: Path  # the working tree's top folder
    prefix: str  # the folder relative to `top`, '/'-terminated, or "" at the top

    @property
    def rel_root(self) -> Path:
        return Path(self.prefix or ".")


def locate(root: Path) -> Place:
    """The working tree that holds `root`; a clear error when there is none."""
    if not root.is_dir():
        raise GitError(f"{root}: no such folder", EXIT_USAGE)
    try:
        out = run(root, "rev-parse", "--show-toplevel", "--show-prefix")
    except GitError as exc:
        if exc.exit_code == EXIT_MISSING_TOOL:
            raise
        raise GitError(f"{root}: not inside a git repository", EXIT_USAGE) from exc
    top, prefix = [*out.decode().splitlines(), ""][:2]
    return Place(Path(top), prefix)


def commit_of(cwd: Path, rev: str) -> str | None:
    """The commit `rev` names, or None when it names none."""
    proc = _run(cwd, ("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"), None, None,
                TIMEOUT_S)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


# ---- remotes and what a checkout step left behind ---------------------------------------


def config_value(cwd: Path, key: str) -> str | None:
    proc = _run(cwd, ("config", "--get", key), None, None, TIMEOUT_S)
    return proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else None


def effective_url(cwd: Path, url: str) -> str:
    """`url` after the repository's `insteadOf` rewriting: where git would really go."""
    return text(cwd, "ls-remote", "--get-url", url)


def credential_headers(cwd: Path) -> list[str]:
    """The config keys of extra HTTP headers (a checkout step's token) set for this
    repository, so kfbot can warn that a credential sits in `.git/config`."""
    proc = _run(cwd, ("config", "--local", "--name-only", "--get-regexp", r"^http\..*"),
                None, None, TIMEOUT_S)
    names = proc.stdout.decode(errors="replace").split()
    return sorted({n for n in names if _HEADER.match(n)})
