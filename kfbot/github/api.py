"""The GitHub REST API through PyGithub: connecting, and failures a person can act on.

    gh = connect()                           # GITHUB_TOKEN or GH_TOKEN, GITHUB_API_URL
    repo = repository(gh, "octo/kernels")
    pr = call(lambda: repo.get_pull(7), "reading pull request #7")

Everything that reaches GitHub goes through `call`, which turns PyGithub's exceptions
into a `GitHubError` (a `KfbotError`) saying what failed and what to do, and waits out
rate limits: it honours `Retry-After` (else the rate-limit reset time) for at most
`Retry.max_wait` seconds a wait and `Retry.attempts` tries in all, then says so. PyGithub's
own retries are switched off so that one policy decides, and tests inject `Retry.sleep`.
No message ever contains the token.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import github
from github.GithubException import GithubException, RateLimitExceededException
from github.Repository import Repository

from kfbot import __version__
from kfbot.errors import EXIT_FAILURE, EXIT_USAGE, KfbotError
from kfbot.evaluate.sandbox import credentials

T = TypeVar("T")

DEFAULT_API_URL = "https://api.github.com"
TOKEN_VARIABLES = ("GITHUB_TOKEN", "GH_TOKEN")
_SLUG = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_SERVER_ERRORS = frozenset({500, 502, 503, 504})
_DEFAULT_RATE_WAIT = 60.0  # GitHub's advice when a secondary limit names no time


@dataclass(frozen=True)
class Retry:
    """How long `call` waits out rate limits and server errors before giving up."""

    attempts: int = 4  # tries in all, the first one included
    max_wait: float = 120.0  # the longest single wait; a longer Retry-After fails at once
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time  # to read x-ratelimit-reset against


DEFAULT_RETRY = Retry()


class GitHubError(KfbotError):
    """GitHub refused or failed a request; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None, detail: str = "",
                 exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message, exit_code)
        self.status = status
        self.detail = detail  # GitHub's own words: its message and validation errors


def find_token(token: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """`token`, else $GITHUB_TOKEN, else $GH_TOKEN; a clear error when there is none."""
    found = credentials.original if env is None else env.get
    for value in (token, *(found(name) for name in TOKEN_VARIABLES)):
        if value and value.strip():
            return value.strip()
    raise KfbotError("no GitHub token: set GITHUB_TOKEN (or GH_TOKEN) to a token that may "
                     "push branches and open pull requests in the repository")


def api_url(base_url: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """`base_url`, else $GITHUB_API_URL (set on GitHub Enterprise runners), else github.com."""
    env = os.environ if env is None else env
    url = (base_url or env.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")
    if not re.match(r"https?://[^/]+", url):
        raise KfbotError(f"GitHub API URL {url!r} is not an http(s) URL (from GITHUB_API_URL "
                         "or the base URL given)")
    return url


def connect(token: str | None = None, base_url: str | None = None, *,
            env: Mapping[str, str] | None = None, read_interval: float = 0.25,
            write_interval: float = 1.0) -> github.Github:
    """A PyGithub client; nothing is requested until it is used.

    The intervals space requests out as GitHub asks of integrations (it answers bursts,
    writes above all, with secondary rate limits); tests against a local server pass 0.
    """
    return github.Github(auth=github.Auth.Token(find_token(token, env)),
                         base_url=api_url(base_url, env), retry=None, per_page=100,
                         timeout=30, user_agent=f"kfbot/{__version__}",
                         seconds_between_requests=read_interval or None,
                         seconds_between_writes=write_interval or None)


def repository(gh: github.Github, full_name: str, retry: Retry = DEFAULT_RETRY) -> Repository:
    """The repository `owner/name`, read once (a 404 says the token cannot see it)."""
    if not _SLUG.fullmatch(full_name):
        raise KfbotError(f"{full_name!r} is not a repository name of the form owner/name")
    return call(lambda: gh.get_repo(full_name), f"opening repository {full_name}", retry)


def call(fn: Callable[[], T], what: str, retry: Retry = DEFAULT_RETRY) -> T:
    """`fn()`, with rate limits and server errors retried and failures made readable.

    `what` says what was being done ("creating the pull request"); it starts every message.
    """
    for attempt in range(1, retry.attempts + 1):
        try:
            return fn()
        except GithubException as exc:
            wait = _wait_for(exc, attempt, retry)
            if wait is None or attempt == retry.attempts:
                raise _give_up(exc, what, attempt) from None
            if wait > retry.max_wait:
                raise GitHubError(f"{what}: GitHub asks to wait {wait:.0f} s ({_limit(exc)}), "
                                  f"longer than the {retry.max_wait:.0f} s kfbot waits; "
                                  "try again later", exc.status, _detail(exc)) from None
            retry.sleep(wait)
        except OSError as exc:  # requests' connection errors are OSErrors
            raise GitHubError(f"{what}: cannot reach GitHub ({type(exc).__name__}: {exc})"
                              ) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def describe(exc: GithubException, what: str) -> GitHubError:
    """The error a person reads for a PyGithub exception (no retrying)."""
    status, detail = exc.status, _detail(exc)
    said = f" ({status}: {detail})" if detail else f" ({status})"
    if status == 401:
        return GitHubError(f"{what}: GitHub rejected the token{said}; check that GITHUB_TOKEN "
                           "(or GH_TOKEN) holds a valid, unexpired token", status, detail,
                           EXIT_USAGE)
    if status == 403:
        return GitHubError(f"{what}: the token is not allowed to do this{said}; publishing "
                           "needs contents: write and pull-requests: write on the repository",
                           status, detail, EXIT_USAGE)
    if status == 404:
        return GitHubError(f"{what}: not found{said}; it does not exist or the token cannot "
                           "see it", status, detail, EXIT_USAGE)
    if status == 422:
        return GitHubError(f"{what}: GitHub refused it{said}", status, detail)
    return GitHubError(f"{what}: GitHub answered{said}", status, detail)


def _give_up(exc: GithubException, what: str, attempts: int) -> GitHubError:
    if _is_rate_limit(exc) and attempts > 1:
        return GitHubError(f"{what}: still rate limited by GitHub after {attempts} tries "
                           f"({_limit(exc)}); try again later", exc.status, _detail(exc))
    if _is_rate_limit(exc):
        return GitHubError(f"{what}: rate limited by GitHub ({_limit(exc)}); try again later",
                           exc.status, _detail(exc))
    if exc.status in _SERVER_ERRORS and attempts > 1:
        error = describe(exc, what)
        return GitHubError(f"{error} (after {attempts} tries)", exc.status, error.detail)
    return describe(exc, what)


def _wait_for(exc: GithubException, attempt: int, retry: Retry) -> float | None:
    """Seconds to wait before trying again, or None when trying again cannot help."""
    if _is_rate_limit(exc):
        after = _header(exc, "retry-after")
        if after is not None and _number(after) is not None:
            return max(0.0, _number(after) or 0.0)
        reset = _number(_header(exc, "x-ratelimit-reset") or "")
        if reset is not None and _header(exc, "x-ratelimit-remaining") == "0":
            return max(0.0, reset - retry.clock()) + 1.0
        return _DEFAULT_RATE_WAIT
    if exc.status in _SERVER_ERRORS:
        return min(float(2 ** (attempt - 1)), retry.max_wait)
    return None


def _is_rate_limit(exc: GithubException) -> bool:
    if isinstance(exc, RateLimitExceededException) or exc.status == 429:
        return True
    return exc.status == 403 and (_header(exc, "x-ratelimit-remaining") == "0"
                                  or _header(exc, "retry-after") is not None)


def _limit(exc: GithubException) -> str:
    after = _header(exc, "retry-after")
    said = f"{exc.status}"
    detail = _detail(exc)
    said += f": {detail}" if detail else ""
    return f"{said}; Retry-After {after}" if after is not None else said


def _header(exc: GithubException, name: str) -> str | None:
    for key, value in (exc.headers or {}).items():
        if key.lower() == name:
            return str(value)
    return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _detail(exc: GithubException) -> str:
    """GitHub's message and its validation errors, one line."""
    data: Any = exc.data
    if not isinstance(data, dict):
        return str(data or "").strip()[:300]
    parts = [str(data.get("message") or "").strip()]
    for error in data.get("errors") or ():
        if isinstance(error, dict):
            parts.append(str(error.get("message") or
                             " ".join(str(error[k]) for k in ("field", "code") if k in error)))
        else:
            parts.append(str(error))
    return ": ".join(part for part in parts if part)
