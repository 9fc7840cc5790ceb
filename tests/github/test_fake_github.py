"""The fake GitHub server answers PyGithub the way GitHub does, so other tests can trust it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import github
import pytest

if TYPE_CHECKING:
    from fake_github import FakeGitHub

pytest_plugins = ["fake_github"]  # the `fake_github` fixture


def _client(server: FakeGitHub, token: str | None = None) -> github.Github:
    return github.Github(auth=github.Auth.Token(token or server.token), base_url=server.base_url,
                         retry=None, seconds_between_requests=0, seconds_between_writes=0)


def _git(cwd: Path, *args: str) -> str:
    env_args = ["-c", "user.name=Ann", "-c", "user.email=ann@example.com"]
    done = subprocess.run(["git", *env_args, *args], cwd=cwd, capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """A bare repository with `main` (one commit) and `feature` (one more)."""
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "a.txt").write_text("a\n")
    _git(work, "add", "a.txt")
    _git(work, "commit", "-q", "-m", "first")
    _git(work, "clone", "-q", "--bare", ".", str(tmp_path / "remote.git"))
    _git(work, "checkout", "-q", "-b", "feature")
    (work / "a.txt").write_text("b\n")
    _git(work, "commit", "-q", "-am", "second")
    _git(work, "push", "-q", str(tmp_path / "remote.git"), "feature")
    return tmp_path / "remote.git"


def test_requests_without_the_token_are_refused(fake_github: FakeGitHub) -> None:
    fake_github.add_repo("octo/kernels")
    with pytest.raises(github.BadCredentialsException):
        _client(fake_github, token="wrong").get_repo("octo/kernels")
    assert _client(fake_github).get_repo("octo/kernels").default_branch == "main"
    assert [(c.status, c.authorization) for c in fake_github.calls] == [
        (401, "token wrong"), (200, f"token {fake_github.token}")]


def test_pull_request_lifecycle_on_a_linked_remote(fake_github: FakeGitHub, bare: Path) -> None:
    fake_github.add_repo("octo/kernels")
    fake_github.link_remote("octo/kernels", bare)
    repo = _client(fake_github).get_repo("octo/kernels")
    pr = repo.create_pull(title="Faster", body="<!-- m -->", head="feature", base="main",
                          draft=True)
    head = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "feature"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert (pr.number, pr.head.sha, pr.draft, pr.user.login) == (1, head, True, "kfbot-app[bot]")
    assert [c.commit.message.strip() for c in pr.get_commits()] == ["second"]
    with pytest.raises(github.GithubException) as info:
        repo.create_pull(title="Again", body="", head="octo:feature", base="main")
    assert info.value.status == 422
    assert "A pull request already exists for octo:feature." in str(info.value.data)
    assert [p.number for p in repo.get_pulls(state="open", head="octo:feature")] == [1]
    assert list(repo.get_pulls(head="octo:other")) == []
    pr.edit(body="new body")
    pr.add_to_labels("kfbot", "performance")
    issue = repo.get_issue(1)
    assert (issue.body, [label.name for label in issue.labels]) == (
        "new body", ["kfbot", "performance"])
    repo.get_git_ref("heads/feature").delete()
    assert repo.get_pull(1).state == "closed"  # GitHub closes a PR whose head was deleted
    with pytest.raises(github.UnknownObjectException):
        repo.get_branch("feature")


def test_create_refuses_unknown_head_and_empty_diff(fake_github: FakeGitHub) -> None:
    fake_github.add_repo("octo/kernels", branches={"main": "a" * 40, "same": "a" * 40})
    repo = _client(fake_github).get_repo("octo/kernels")
    for head, expected in (("missing", "'field': 'head'"), ("same", "No commits between")):
        with pytest.raises(github.GithubException) as info:
            repo.create_pull(title="t", body="", head=head, base="main")
        assert info.value.status == 422 and expected in str(info.value.data)


def test_comments_reactions_and_permissions(fake_github: FakeGitHub) -> None:
    fake_github.add_repo("octo/kernels", branches={"main": "a" * 40, "f": "b" * 40})
    pr = fake_github.add_pull("octo/kernels", head="f", user="alice")
    seeded = fake_github.add_comment("octo/kernels", pr["number"], "/kfbot help", user="alice")
    fake_github.set_permission("octo/kernels", "alice", "maintain")
    repo = _client(fake_github).get_repo("octo/kernels")
    comment = repo.get_pull(pr["number"]).get_issue_comment(seeded["id"])
    assert (comment.body, comment.user.login, comment.user.type) == ("/kfbot help", "alice",
                                                                     "User")
    assert comment.create_reaction("eyes").content == "eyes"
    assert [r.content for r in comment.get_reactions()] == ["eyes"]
    reply = repo.get_issue(pr["number"]).create_comment("done")
    reply.edit("done, edited")
    assert [c.body for c in repo.get_issue(pr["number"]).get_comments()] == [
        "/kfbot help", "done, edited"]
    assert repo.get_collaborator_permission("alice") == "write"
    assert repo.get_collaborator_role_name("alice") == "maintain"
    with pytest.raises(github.UnknownObjectException):
        repo.get_collaborator_permission("stranger")


def test_injected_failures_come_first_then_clear(fake_github: FakeGitHub) -> None:
    fake_github.add_repo("octo/kernels")
    fake_github.fail_next("GET", r"/repos/octo/kernels", 403, times=2,
                          body={"message": "API rate limit exceeded for installation."},
                          headers={"Retry-After": "1", "x-ratelimit-remaining": "0"})
    gh = _client(fake_github)
    for _ in range(2):
        with pytest.raises(github.RateLimitExceededException) as info:
            gh.get_repo("octo/kernels")
        assert info.value.headers is not None and info.value.headers["retry-after"] == "1"
    assert gh.get_repo("octo/kernels").full_name == "octo/kernels"
    assert fake_github.endpoints() == ["GET /repos/octo/kernels"] * 3


def test_lists_are_paginated_with_link_headers(fake_github: FakeGitHub) -> None:
    fake_github.add_repo("octo/kernels", branches={"main": "a" * 40})
    for i in range(5):
        fake_github.add_branch("octo/kernels", f"b{i}", f"{i}" * 40)
        fake_github.add_pull("octo/kernels", head=f"b{i}")
    gh = github.Github(auth=github.Auth.Token(fake_github.token), base_url=fake_github.base_url,
                       retry=None, per_page=2, seconds_between_requests=0)
    numbers = [p.number for p in gh.get_repo("octo/kernels").get_pulls(state="all")]
    assert numbers == [5, 4, 3, 2, 1]
    assert fake_github.endpoints(with_query=True)[1:] == [
        "GET /repos/octo/kernels/pulls?per_page=2&state=all",
        "GET /repos/octo/kernels/pulls?page=2&per_page=2&state=all",
        "GET /repos/octo/kernels/pulls?page=3&per_page=2&state=all"]


def test_git_data_objects_are_real_objects_of_the_linked_repository(
        fake_github: FakeGitHub, bare: Path) -> None:
    from github.GithubException import GithubException
    from github.InputGitTreeElement import InputGitTreeElement

    fake_github.add_repo("octo/kernels")
    fake_github.link_remote("octo/kernels", bare)
    repo = _client(fake_github).get_repo("octo/kernels")
    main = repo.get_git_ref("heads/main").object.sha
    base = repo.get_git_commit(main)
    tree = repo.get_git_tree(base.tree.sha)
    assert [(e.path, e.mode, e.type) for e in tree.tree] == [("a.txt", "100644", "blob")]
    assert repo.get_git_blob(tree.tree[0].sha).content.strip() == "YQo="  # "a\n"
    blob = repo.create_git_blob("bmV3Cg==", "base64")
    new_tree = repo.create_git_tree([InputGitTreeElement("sub/dir/b.txt", "100755", "blob",
                                                         sha=blob.sha)], tree)
    commit = repo.create_git_commit("add b", new_tree, [base])
    assert _git(bare, "ls-tree", "-r", commit.sha) == (
        f"100644 blob {tree.tree[0].sha}\ta.txt\n100755 blob {blob.sha}\tsub/dir/b.txt")
    assert _git(bare, "show", f"{commit.sha}:sub/dir/b.txt") == "new"
    assert _git(bare, "rev-parse", f"{commit.sha}^") == main
    repo.create_git_ref("refs/heads/kfbot/x", commit.sha)
    with pytest.raises(GithubException) as exists:
        repo.create_git_ref("refs/heads/kfbot/x", commit.sha)
    assert exists.value.status == 422
    ref = repo.get_git_ref("heads/feature")
    with pytest.raises(GithubException) as not_ff:
        ref.edit(commit.sha)
    assert "not a fast forward" in str(not_ff.value.data)
    ref.edit(commit.sha, force=True)
    assert _git(bare, "rev-parse", "feature") == commit.sha
    compared = repo.compare("main", "kfbot/x")
    assert [c.commit.message for c in compared.commits] == ["add b"]
