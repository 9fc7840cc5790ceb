"""The GitHub client against a real HTTP fake: tokens, readable failures, rate limits
waited out within bounds, and no token in any message."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import github
import pytest

from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.github.api import GitHubError, Retry, api_url, call, connect, find_token, repository

if TYPE_CHECKING:
    from fake_github import FakeGitHub

pytest_plugins = ["fake_github"]

SLUG = "octo/kernels"
RATE = {"message": "API rate limit exceeded for installation ID 42."}


def _gh(fake: FakeGitHub, token: str | None = None) -> github.Github:
    return connect(token or fake.token, fake.base_url, env={}, read_interval=0,
                   write_interval=0)


def _retry(sleeps: list[float], **kw: float) -> Retry:
    return Retry(sleep=sleeps.append, **kw)  # type: ignore[arg-type]


def test_the_token_comes_from_the_argument_then_the_environment() -> None:
    assert find_token("given", {"GITHUB_TOKEN": "env"}) == "given"
    assert find_token(None, {"GITHUB_TOKEN": " env ", "GH_TOKEN": "gh"}) == "env"
    assert find_token(None, {"GITHUB_TOKEN": "", "GH_TOKEN": "gh"}) == "gh"
    with pytest.raises(KfbotError, match="no GitHub token: set GITHUB_TOKEN") as info:
        find_token(None, {})
    assert info.value.exit_code == EXIT_USAGE


def test_the_api_url_comes_from_the_argument_then_the_environment() -> None:
    assert api_url(None, {}) == "https://api.github.com"
    assert api_url(None, {"GITHUB_API_URL": "https://ghe.example/api/v3/"}) == \
        "https://ghe.example/api/v3"
    assert api_url("http://127.0.0.1:9", {"GITHUB_API_URL": "https://x"}) == "http://127.0.0.1:9"
    with pytest.raises(KfbotError, match="not an http"):
        api_url("ftp://example", {})


def test_connect_reads_the_environment_and_sends_the_token(fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG, default_branch="trunk")
    gh = connect(env=fake_github.env(), read_interval=0, write_interval=0)
    assert repository(gh, SLUG).default_branch == "trunk"
    assert [(c.path, c.authorization) for c in fake_github.calls] == [
        (f"/repos/{SLUG}", f"token {fake_github.token}")]


def test_a_bad_token_says_so_without_showing_it(fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG)
    secret = "ghp_notTheRightOne1234567890"
    with pytest.raises(GitHubError) as info:
        repository(_gh(fake_github, secret), SLUG)
    message = str(info.value)
    assert message.startswith(f"opening repository {SLUG}: GitHub rejected the token (401: Bad "
                              "credentials)")
    assert "GITHUB_TOKEN" in message and secret not in message
    assert (info.value.status, info.value.exit_code) == (401, EXIT_USAGE)


@pytest.mark.parametrize(("status", "body", "said"), [
    (403, {"message": "Resource not accessible by integration"},
     "the token is not allowed to do this (403: Resource not accessible by integration)"),
    (404, {"message": "Not Found"}, "not found (404: Not Found); it does not exist or the token"),
    (422, {"message": "Validation Failed", "errors": [
        {"resource": "PullRequest", "code": "custom",
         "message": "A pull request already exists for octo:kfbot/x."}]},
     "GitHub refused it (422: Validation Failed: A pull request already exists for "
     "octo:kfbot/x.)"),
    (422, {"message": "Validation Failed", "errors": [
        {"resource": "PullRequest", "field": "head", "code": "invalid"}]},
     "GitHub refused it (422: Validation Failed: head invalid)"),
])
def test_failures_are_translated_with_githubs_words(fake_github: FakeGitHub, status: int,
                                                   body: dict[str, object], said: str) -> None:
    fake_github.add_repo(SLUG)
    fake_github.fail_next("GET", f"/repos/{SLUG}", status, body=body)
    with pytest.raises(GitHubError) as info:
        repository(_gh(fake_github), SLUG, _retry([]))
    assert str(info.value).startswith(f"opening repository {SLUG}: {said}")
    assert info.value.status == status
    assert len(fake_github.calls) == 1  # not retried


def test_a_rate_limit_is_waited_out_as_retry_after_says(fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG)
    fake_github.fail_next("GET", f"/repos/{SLUG}", 403, body=RATE, times=2,
                          headers={"Retry-After": "3", "x-ratelimit-remaining": "0"})
    sleeps: list[float] = []
    assert repository(_gh(fake_github), SLUG, _retry(sleeps)).full_name == SLUG
    assert sleeps == [3.0, 3.0]
    assert [c.status for c in fake_github.calls] == [403, 403, 200]


def test_without_retry_after_the_reset_time_is_used(fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG)
    fake_github.fail_next("GET", f"/repos/{SLUG}", 403, body=RATE,
                          headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1005"})
    sleeps: list[float] = []
    repository(_gh(fake_github), SLUG, Retry(sleep=sleeps.append, clock=lambda: 1000.0))
    assert sleeps == [6.0]


def test_a_rate_limit_that_persists_or_asks_too_long_fails_clearly(
        fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG)
    fake_github.fail_next("GET", f"/repos/{SLUG}", 429, body=RATE, times=3,
                          headers={"Retry-After": "1"})
    sleeps: list[float] = []
    with pytest.raises(GitHubError, match=r"still rate limited by GitHub after 3 tries \(429: "
                                          r"API rate limit exceeded .*Retry-After 1\)"):
        repository(_gh(fake_github), SLUG, _retry(sleeps, attempts=3))
    assert sleeps == [1.0, 1.0]

    fake_github.fail_next("GET", f"/repos/{SLUG}", 403, body=RATE,
                          headers={"Retry-After": "3600", "x-ratelimit-remaining": "0"})
    sleeps.clear()
    with pytest.raises(GitHubError, match=r"GitHub asks to wait 3600 s .* longer than the 60 s "
                                          r"kfbot waits; try again later"):
        repository(_gh(fake_github), SLUG, _retry(sleeps, max_wait=60))
    assert sleeps == []


def test_server_errors_are_retried_with_backoff(fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG)
    fake_github.fail_next("GET", f"/repos/{SLUG}", 502, times=2)
    sleeps: list[float] = []
    assert repository(_gh(fake_github), SLUG, _retry(sleeps)).full_name == SLUG
    assert sleeps == [1.0, 2.0]
    fake_github.fail_next("GET", f"/repos/{SLUG}", 503, times=9)
    with pytest.raises(GitHubError, match=r"GitHub answered \(503: Service Unavailable\) "
                                          r"\(after 2 tries\)"):
        repository(_gh(fake_github), SLUG, _retry([], attempts=2))


def test_an_unreachable_server_and_a_bad_name_are_said_plainly() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gh = connect("t0ken-value-123", f"http://127.0.0.1:{port}", env={}, read_interval=0)
    with pytest.raises(GitHubError, match="opening repository octo/k: cannot reach GitHub") as info:
        repository(gh, "octo/k")
    assert "t0ken-value-123" not in str(info.value)
    with pytest.raises(KfbotError, match="'octo' is not a repository name of the form owner/name"):
        repository(gh, "octo")


def test_call_returns_the_value_and_names_what_failed(fake_github: FakeGitHub) -> None:
    fake_github.add_repo(SLUG)
    repo = repository(_gh(fake_github), SLUG)
    assert call(lambda: repo.full_name, "reading the name") == SLUG
    with pytest.raises(GitHubError, match="reading pull request #9: not found"):
        call(lambda: repo.get_pull(9), "reading pull request #9")
