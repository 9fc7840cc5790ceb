"""Publishing a winner as a pull request, on real git repositories and a real HTTP fake
of GitHub: created, updated, left alone, capped, dry-run, and never touching the user's
checkout or leaking the token."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kfbot.anticheat.findings import Finding
from kfbot.config import Config, GithubConfig
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Check, Evaluation, ShapeTiming
from kfbot.evaluate.reproduce.model import Reproduction, ShapeFigures
from kfbot.evaluate.task import make_task
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.github.api import GitHubError, Retry
from kfbot.github.markers import find_pr_marker, pr_marker
from kfbot.github.publish import (
    REVIEW_LABEL,
    PublishSettings,
    Winner,
    publish,
    publish_after_run,
    slug_of,
)
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.branch import auth_env, pr_branch
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.islands import SearchResult
from kfbot.search.experience import Lesson, append_lessons
from kfbot.search.model import Cell
from kfbot.search.runner import OptimizeOutcome

if TYPE_CHECKING:
    from fake_github import FakeGitHub

pytest_plugins = ["fake_github"]

SLUG = "octo/kernels"
KERNEL = "csrc/softmax.cu::softmax_kernel"
BRANCH = "kfbot/csrc-softmax.cu-softmax_kernel"
ORIGINAL = "__global__ void softmax_kernel(float* x) { /* naive */ }\n"
FAST = "__global__ void softmax_kernel(float* x) { /* warp shuffles */ }\n"
FASTER = "__global__ void softmax_kernel(float* x) { /* vectorized + shuffles */ }\n"
PR = f"/repos/{SLUG}/pulls"


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _remote_head(remote: Path, branch: str) -> str | None:
    done = subprocess.run(["git", "--git-dir", str(remote), "rev-parse", "--verify", "-q",
                           f"refs/heads/{branch}"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def _evaluation(speedup: float, candidate: str = "c" * 64) -> Evaluation:
    rng = random.Random(7)
    timings = []
    for i, shape in enumerate(("(4096, 1024) float32", "(128, 50257) float32")):
        base = [100.0 + i + rng.random() for _ in range(30)]
        cand = [b / speedup for b in base]
        timings.append(ShapeTiming(shape, compare_times(base, cand, random.Random(i))))
    checks = tuple(Check(shape, against, True, max_abs_error=1e-6)
                   for shape in ("(4096, 1024) float32", "(128, 50257) float32", "(1, 7) float32")
                   for against in ("reference", "original"))
    return Evaluation(candidate=candidate, stage="done", ok=True, reason="correct and faster",
                      checks=checks, timings=tuple(timings),
                      environment={"gpu": "NVIDIA H100", "cuda": "12.4", "torch": "2.5.1"})


LESSON = Lesson(KERNEL, "NVIDIA H100", "warp-shuffle reduction", "llm", "faster", 1.84, None,
                "", "2026-01-15")


@pytest.fixture
def repos(tmp_path: Path, fake_github: FakeGitHub) -> tuple[Path, Path]:
    """(the user's clone, the bare remote), the remote linked to the fake's `octo/kernels`."""
    seed = tmp_path / "seed"
    seed.mkdir()
    _git(seed, "init", "-q", "-b", "main")
    (seed / "csrc").mkdir()
    (seed / "csrc" / "softmax.cu").write_text(ORIGINAL)
    (seed / "README.md").write_text("kernels\n")
    (seed / ".gitignore").write_text(".kfbot/\n")  # run folders; the experience file is forced
    _git(seed, "add", ".")
    _git(seed, "-c", "user.name=Owner", "-c", "user.email=owner@example.com", "commit", "-q",
         "-m", "initial")
    remote = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    work = tmp_path / "work"
    _git(tmp_path, "clone", "-q", str(remote), str(work))
    _git(work, "config", "user.name", "Dev")
    _git(work, "config", "user.email", "dev@example.com")
    fake_github.add_repo(SLUG)
    fake_github.link_remote(SLUG, remote)
    return work, remote


def _reproduction(ev: Evaluation, factor: float = 0.99) -> Reproduction:
    """A second timer's figures for `ev`: each shape at `factor` times its speedup."""
    shapes = tuple(ShapeFigures(t.input, t.speedup.ratio, t.speedup.ratio * factor,
                                t.speedup.baseline.median,
                                t.speedup.baseline.median / (t.speedup.ratio * factor), 40)
                   for t in ev.timings)
    return Reproduction(ev.candidate, shapes, "CUDA events, L2 flushed, ABBA order",
                        {"gpu": "NVIDIA H100"})


def _winner(work: Path, speedup: float = 1.84, text: str = FAST,
            candidate: str = "c" * 64, evaluation: Evaluation | None = None) -> Winner:
    ev = evaluation or _evaluation(speedup, candidate)
    return Winner(work, KERNEL, "softmax_kernel", {"csrc/softmax.cu": text}, ev,
                  "one warp per row with shuffle reductions",
                  (replace(LESSON, speedup=speedup),), reproduction=_reproduction(ev))


def _settings(fake: FakeGitHub, sleeps: list[float] | None = None, **github: object
              ) -> PublishSettings:
    return PublishSettings(github=GithubConfig(**github),  # type: ignore[arg-type]
                           repo_slug=SLUG, token=fake.token, base_url=fake.base_url,
                           env={"GITHUB_SERVER_URL": "https://github.com"},
                           retry=Retry(sleep=(sleeps if sleeps is not None else []).append),
                           read_interval=0, write_interval=0)


def _snapshot(work: Path) -> dict[str, bytes]:
    """Every file of the working tree and the index, byte for byte."""
    files = {str(p.relative_to(work)): p.read_bytes() for p in work.rglob("*")
             if p.is_file() and ".git" not in p.relative_to(work).parts}
    files[".git/index"] = (work / ".git" / "index").read_bytes()
    files["refs"] = _git(work, "for-each-ref").encode()
    files["HEAD"] = (work / ".git" / "HEAD").read_bytes()
    return files


def test_a_winner_becomes_a_pull_request_and_the_checkout_is_untouched(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, remote = repos
    (work / "csrc" / "softmax.cu").write_text("// my uncommitted work\n")
    (work / "README.md").write_text("staged change\n")
    _git(work, "add", "README.md")
    (work / "notes.txt").write_text("untracked\n")
    before = _snapshot(work)

    result = publish(_winner(work), _settings(fake_github))

    assert (result.operation, result.number, result.branch) == ("created", 1, BRANCH)
    assert result.url == f"https://github.com/{SLUG}/pull/1"
    assert result.outputs() == {"pr-url": result.url, "pr-number": "1",
                                "pr-operation": "created"}
    assert fake_github.endpoints() == [f"GET /repos/{SLUG}", f"GET {PR}", f"POST {PR}",
                                       f"POST /repos/{SLUG}/issues/1/labels"]
    create = fake_github.calls[2].json
    assert (create["head"], create["base"], create["draft"]) == (BRANCH, "main", False)
    assert fake_github.calls[3].json == ["kfbot"]
    head = _remote_head(remote, BRANCH)
    assert head is not None and head == result.sha
    assert _git(remote, "rev-parse", f"{head}^") == _remote_head(remote, "main")
    assert _git(remote, "show", f"{head}:csrc/softmax.cu") + "\n" == FAST
    experience = _git(remote, "show", f"{head}:.kfbot/experience.md")
    assert "### Lesson: " in experience and "warp-shuffle reduction" in experience
    message = _git(remote, "log", "-1", "--format=%B", head)
    assert message.startswith("kfbot: softmax_kernel 1.8") and f"Kfbot-Kernel: {KERNEL}" in message
    assert _git(remote, "log", "-1", "--format=%ae", head) == "dev@example.com"
    body = fake_github.pulls[SLUG][1]["body"]
    assert body.splitlines()[0].startswith("softmax_kernel: 1.8")
    assert find_pr_marker(body, KERNEL) == {"kernel": KERNEL, "sha": head,
                                            "candidate": "c" * 64, "speedup": "1.840"}
    assert fake_github.pulls[SLUG][1]["labels"] == ["kfbot"]
    assert _snapshot(work) == before  # working tree, index, refs, HEAD: byte-identical
    assert _git(work, "worktree", "list").count("\n") == 0


def test_a_rerun_updates_the_same_pull_request_and_says_what_changed(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, remote = repos
    first = publish(_winner(work), _settings(fake_github))
    fake_github.clear_calls()

    second = publish(_winner(work, 2.1, FASTER, "d" * 64), _settings(fake_github))

    assert (second.operation, second.number) == ("updated", first.number)
    assert fake_github.endpoints() == [f"GET /repos/{SLUG}", f"GET {PR}", f"PATCH {PR}/1",
                                       f"POST /repos/{SLUG}/issues/1/comments"]
    head = _remote_head(remote, BRANCH)
    assert head == second.sha and head != first.sha
    assert _git(remote, "rev-list", "--count", f"main..{BRANCH}") == "1"  # replaced, not stacked
    body = fake_github.pulls[SLUG][1]["body"]
    assert "## What changed since the last run" in body
    assert "Speedup 1.84x → 2.10x; a new kernel change" in body
    assert fake_github.calls[2].json["title"] == "kfbot: softmax_kernel 2.10x faster on NVIDIA H100"
    comment = fake_github.comments_on(SLUG, 1)[0]["body"]
    assert "1.84x → 2.10x" in comment and (second.sha or "")[:10] in comment
    assert len(fake_github.pulls[SLUG]) == 1
    fake_github.clear_calls()

    third = publish(_winner(work, 2.1, FASTER, "d" * 64), _settings(fake_github))

    assert (third.operation, third.number, third.sha) == ("unchanged", 1, head)
    assert fake_github.endpoints() == [f"GET /repos/{SLUG}", f"GET {PR}"]
    assert _remote_head(remote, BRANCH) == head


def test_commits_a_person_pushed_are_never_overwritten(
        repos: tuple[Path, Path], fake_github: FakeGitHub, tmp_path: Path) -> None:
    work, remote = repos
    publish(_winner(work), _settings(fake_github))
    person = tmp_path / "person"
    _git(tmp_path, "clone", "-q", "-b", BRANCH, str(remote), str(person))
    (person / "csrc" / "softmax.cu").write_text("// a reviewer's fix\n")
    _git(person, "-c", "user.name=Rev", "-c", "user.email=rev@example.com", "commit", "-qam",
         "review fix")
    _git(person, "push", "-q", "origin", BRANCH)
    theirs = _remote_head(remote, BRANCH)
    body = fake_github.pulls[SLUG][1]["body"]
    fake_github.clear_calls()

    result = publish(_winner(work, 2.1, FASTER, "d" * 64), _settings(fake_github))

    assert (result.operation, result.number) == ("skipped", 1)
    assert "commits kfbot did not push" in result.message and "not overwriting" in result.message
    assert _remote_head(remote, BRANCH) == theirs
    assert fake_github.pulls[SLUG][1]["body"] == body
    assert fake_github.endpoints() == [f"GET /repos/{SLUG}", f"GET {PR}"]


def test_a_branch_with_someone_elses_commits_and_no_pr_is_left_alone(
        repos: tuple[Path, Path], fake_github: FakeGitHub, tmp_path: Path) -> None:
    work, remote = repos
    person = tmp_path / "person"
    _git(tmp_path, "clone", "-q", str(remote), str(person))
    (person / "csrc" / "softmax.cu").write_text("// hand-tuned\n")
    _git(person, "-c", "user.name=Rev", "-c", "user.email=rev@example.com", "commit", "-qam",
         "mine")
    _git(person, "push", "-q", "origin", f"HEAD:refs/heads/{BRANCH}")
    theirs = _remote_head(remote, BRANCH)

    result = publish(_winner(work), _settings(fake_github))

    assert result.operation == "skipped" and "commit(s) kfbot did not make" in result.message
    assert _remote_head(remote, BRANCH) == theirs
    assert "POST" not in " ".join(fake_github.endpoints())


def test_the_cap_on_open_pull_requests_refuses_a_new_one_but_allows_updates(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, remote = repos
    _git(remote, "branch", "kfbot/other", "main")
    fake_github.add_pull(SLUG, head="kfbot/other", user="kfbot-app[bot]",
                         body="x\n" + pr_marker("csrc/mm.cu::mm", sha="e" * 40))
    fake_github.add_pull(SLUG, head="feature", body="a person's PR")

    refused = publish(_winner(work), _settings(fake_github, max_open_prs=1))

    assert refused.operation == "skipped" and refused.number is None
    assert "1 kfbot pull requests are open and github.max_open_prs is 1" in refused.message
    assert _remote_head(remote, BRANCH) is None
    assert fake_github.endpoints() == [f"GET /repos/{SLUG}", f"GET {PR}"]

    created = publish(_winner(work), _settings(fake_github, max_open_prs=2))
    updated = publish(_winner(work, 2.1, FASTER, "d" * 64), _settings(fake_github, max_open_prs=2))
    assert (created.operation, updated.operation, updated.number) == ("created", "updated", 3)


def test_labels_and_draft_are_sent(repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    result = publish(_winner(work), _settings(fake_github, labels=("kfbot", "performance"),
                                              draft=True))
    create, labels = fake_github.calls[2], fake_github.calls[3]
    assert (create.method, create.json["draft"]) == ("POST", True)
    assert (labels.path, labels.json) == (f"/repos/{SLUG}/issues/{result.number}/labels",
                                          ["kfbot", "performance"])
    assert fake_github.pulls[SLUG][1]["draft"] is True


def test_the_draft_flag_overrides_the_config_and_no_labels_means_no_call(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    settings = replace(_settings(fake_github, labels=(), draft=True), draft=False)
    publish(_winner(work), settings)
    assert fake_github.calls[2].json["draft"] is False
    assert fake_github.endpoints() == [f"GET /repos/{SLUG}", f"GET {PR}", f"POST {PR}"]


def test_dry_run_writes_body_and_diff_without_network(
        repos: tuple[Path, Path], fake_github: FakeGitHub, tmp_path: Path) -> None:
    work, remote = repos
    before = _snapshot(work)
    out = tmp_path / "out"
    settings = replace(_settings(fake_github), token=None, dry_run_dir=out)

    result = publish(_winner(work), settings)

    assert result.operation == "dry-run" and result.url is None
    assert fake_github.calls == []
    assert _remote_head(remote, BRANCH) is None
    body = (out / "pr-body.md").read_text()
    assert body.startswith("softmax_kernel: 1.84x faster") and pr_marker(KERNEL)[:30] in body
    patch = (out / "pr.diff").read_text()
    assert "+__global__ void softmax_kernel(float* x) { /* warp shuffles */ }" in patch
    assert "+++ b/.kfbot/experience.md" in patch
    meta = json.loads((out / "pr.json").read_text())
    assert (meta["branch"], meta["base"], meta["labels"], meta["draft"]) == (
        BRANCH, "main", ["kfbot"], False)
    assert _snapshot(work) == before


def test_a_pull_request_that_already_exists_is_found_and_updated(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    publish(_winner(work), _settings(fake_github))
    fake_github.clear_calls()
    # The listing misses the PR (it was opened meanwhile): creating it is a 422.
    fake_github.fail_next("GET", PR, 200, body=[])

    result = publish(_winner(work, 2.1, FASTER, "d" * 64), _settings(fake_github))

    assert (result.operation, result.number) == ("updated", 1)
    assert fake_github.endpoints(with_query=True) == [
        f"GET /repos/{SLUG}", f"GET {PR}?per_page=100&state=open", f"POST {PR}",
        f"GET {PR}?head=octo:{BRANCH}&per_page=100&state=open", f"PATCH {PR}/1",
        f"POST /repos/{SLUG}/issues/1/comments"]
    assert fake_github.calls[2].status == 422
    assert "2.10x" in fake_github.pulls[SLUG][1]["body"].splitlines()[0]


def test_a_rate_limit_is_waited_out_then_the_request_succeeds(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    fake_github.fail_next("POST", PR, 403, headers={"Retry-After": "1",
                                                    "x-ratelimit-remaining": "0"},
                          body={"message": "API rate limit exceeded for installation ID 1."})
    sleeps: list[float] = []
    result = publish(_winner(work), _settings(fake_github, sleeps))
    assert (result.operation, sleeps) == ("created", [1.0])
    assert [c.status for c in fake_github.calls if c.method == "POST"] == [403, 201, 200]


def test_a_persistent_rate_limit_fails_clearly(repos: tuple[Path, Path],
                                               fake_github: FakeGitHub) -> None:
    work, _ = repos
    fake_github.fail_next("GET", PR, 429, headers={"Retry-After": "2"}, times=10,
                          body={"message": "You have exceeded a secondary rate limit."})
    sleeps: list[float] = []
    with pytest.raises(GitHubError, match="still rate limited by GitHub after 4 tries"):
        publish(_winner(work), _settings(fake_github, sleeps))
    assert sleeps == [2.0, 2.0, 2.0]


def test_a_branch_deleted_under_its_pull_request_is_recreated(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, remote = repos
    first = publish(_winner(work), _settings(fake_github))
    _git(remote, "update-ref", "-d", f"refs/heads/{BRANCH}")  # GitHub then closes the PR

    again = publish(_winner(work), _settings(fake_github))

    assert (again.operation, again.number) == ("created", 2)
    assert fake_github.pulls[SLUG][first.number or 0]["state"] == "closed"
    head = _remote_head(remote, BRANCH)
    assert head == again.sha and _git(remote, "rev-parse", f"{head}^") == _remote_head(
        remote, "main")


def test_no_token_is_a_clear_error_before_any_network(repos: tuple[Path, Path],
                                                      fake_github: FakeGitHub) -> None:
    work, remote = repos
    with pytest.raises(KfbotError, match="no GitHub token: set GITHUB_TOKEN"):
        publish(_winner(work), replace(_settings(fake_github), token=None))
    assert fake_github.calls == [] and _remote_head(remote, BRANCH) is None


def test_what_is_not_publishable_is_skipped_without_network(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    slow = publish(_winner(work, 1.03), _settings(fake_github))
    assert slow.operation == "skipped" and "below github.min_speedup (1.05x)" in slow.message
    rejected = replace(_winner(work), evaluation=replace(_evaluation(1.8), ok=False,
                                                         stage="correctness",
                                                         reason="tail block differs"))
    refused = publish(rejected, _settings(fake_github))
    assert refused.message == ("not published: the candidate was rejected at correctness: "
                               "tail block differs")
    assert fake_github.calls == []


def test_the_token_is_written_nowhere(repos: tuple[Path, Path], fake_github: FakeGitHub,
                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work, remote = repos
    # An https remote, as on GitHub, that git rewrites to the local bare repository: the
    # slug comes from the URL and the push carries the token as an extra header.
    https = f"https://github.com/{SLUG}.git"
    _git(work, "remote", "set-url", "origin", https)
    _git(work, "config", f"url.{remote}.insteadOf", https)
    result = publish(_winner(work), replace(_settings(fake_github), repo_slug=None))
    assert result.operation == "created" and _remote_head(remote, BRANCH) == result.sha
    publish(_winner(work), replace(_settings(fake_github), dry_run_dir=tmp_path / "dry"))
    token = fake_github.token.encode()
    for path in [*work.rglob("*"), *(tmp_path / "dry").rglob("*"), *remote.rglob("*")]:
        if path.is_file():
            assert token not in path.read_bytes(), path
    assert fake_github.token not in repr(result) + capsys.readouterr().out
    assert fake_github.token not in fake_github.pulls[SLUG][1]["body"]
    assert _git(work, "remote", "get-url", "--push", "origin") == str(remote)
    assert "extraheader" not in _git(work, "config", "--list")
    env = auth_env(https, fake_github.token)
    assert fake_github.token not in json.dumps(env)
    assert env["GIT_CONFIG_KEY_1"] == "http.https://github.com/.extraheader"
    assert env["GIT_CONFIG_VALUE_1"].startswith("AUTHORIZATION: basic ")
    assert auth_env("git@github.com:octo/kernels.git", fake_github.token) == {
        "GIT_TERMINAL_PROMPT": "0"}


def test_branch_names_and_repository_slugs() -> None:
    assert pr_branch(KERNEL) == BRANCH
    odd = pr_branch("a b/../x.cu::ns::op<float>.lock")
    assert odd == "kfbot/a-b-.-x.cu-ns-op-float"
    for name in (odd, pr_branch(".."), pr_branch("x@{y}~^:?*[")):
        assert subprocess.run(["git", "check-ref-format", f"refs/heads/{name}"]).returncode == 0
    assert slug_of("git@github.com:octo/kernels.git") == SLUG
    assert slug_of("https://github.com/octo/kernels") == SLUG
    assert slug_of("/srv/git/kernels.git") is None


def test_optimize_publish_takes_the_runs_winner_and_lessons(
        tmp_path: Path, fake_github: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "load_elementwise"
    seed = tmp_path / "seed"
    shutil.copytree(fixture, seed)
    _git(seed, "init", "-q", "-b", "main")
    _git(seed, "add", ".")
    _git(seed, "-c", "user.name=O", "-c", "user.email=o@example.com", "commit", "-qm", "init")
    remote = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    work = tmp_path / "work"
    _git(tmp_path, "clone", "-q", str(remote), str(work))
    fake_github.add_repo(SLUG)
    fake_github.link_remote(SLUG, remote)
    for key, value in fake_github.env().items():
        monkeypatch.setenv(key, value)
    task = make_task(select_kernel(scan(work, Config()).kernels, "gelu_kernel"), work, Config())
    lesson = Lesson(task.kernel_id, "NVIDIA H100", "float4 loads", "rules", "faster", 1.6, None,
                    "", "2026-01-15")
    append_lessons(work / ".kfbot" / "experience.md", [lesson, replace(lesson, kernel="other")])
    fast = (work / "csrc" / "gelu_kernel.cu").read_text().replace("kBlockSize = 128",
                                                                  "kBlockSize = 256")
    cand = Candidate({"csrc/gelu_kernel.cu": fast}, origin="rules", rationale="bigger blocks")
    best = Individual(cand.hash, None, 0, Cell("global", "none", "thread-per-element", "256"),
                      1.6, "done", "correct", "rules", 1)
    ev = _evaluation(1.6, cand.hash)
    outcome = OptimizeOutcome(SearchResult(best, [], [best]), ev, cand, {"evaluations": 1.0},
                              committed=(ev, cand))
    args = argparse.Namespace(config=None, repo_slug=SLUG, remote="origin", draft=None,
                              publish_dry_run=None)

    result = publish_after_run(task, outcome, 2, args, _reproduction(ev))

    assert (result.operation, result.branch) == ("created", "kfbot/csrc-gelu_kernel.cu-gelu_kernel")
    head = _remote_head(remote, result.branch)
    assert "kBlockSize = 256" in _git(remote, "show", f"{head}:csrc/gelu_kernel.cu")
    experience = _git(remote, "show", f"{head}:.kfbot/experience.md")
    assert "float4 loads" in experience and "- kernel: other" not in experience
    body = fake_github.pulls[SLUG][1]["body"]
    assert "- float4 loads (rules, NVIDIA H100): 1.600x faster" in body
    assert "bigger blocks" in body and "1 evaluation on 2 islands." in body

    # The winner needs a build parameter and nothing file-only was faster: not published.
    tuned = replace(outcome, best_candidate=replace(cand, params={"kBlockSize": "512"}),
                    committed=None)
    skipped = publish_after_run(task, tuned, 2, args, None)
    assert skipped.operation == "skipped"
    assert "build parameters: kBlockSize" in skipped.message


def test_only_a_reproduced_winner_is_published(repos: tuple[Path, Path],
                                               fake_github: FakeGitHub) -> None:
    work, remote = repos
    unreproduced = replace(_winner(work), reproduction=None)
    assert publish(unreproduced, _settings(fake_github)).message == (
        "not published: it was not reproduced (kfbot reproduce)")
    ev = _evaluation(1.84)
    short = replace(_winner(work), reproduction=_reproduction(ev, 0.94))
    refused = publish(short, _settings(fake_github))
    assert refused.operation == "skipped"
    assert refused.message == ("not published: the reproduction measured 1.73x where the run "
                               "reported 1.84x, more than 5% below")
    other = replace(_winner(work), reproduction=_reproduction(_evaluation(1.84, "e" * 64)))
    assert "the reproduction is of candidate eeeeeeeeee, the report of cccccccccc" in \
        publish(other, _settings(fake_github)).message
    assert fake_github.calls == [] and _remote_head(remote, BRANCH) is None

    within = replace(_winner(work), reproduction=_reproduction(ev, 0.96))
    assert publish(within, _settings(fake_github)).operation == "created"
    body = fake_github.pulls[SLUG][1]["body"]
    assert "## Reproduced" in body and body.index("## Benchmark") < body.index("## Reproduced")
    head = _remote_head(remote, BRANCH) or ""
    message = _git(remote, "log", "-1", "--format=%B", head)
    assert f"Kfbot-Candidate: {'c' * 64}" in message  # the commit names the same candidate
    assert "reproduced 1.77x against the reported 1.84x (-4.0%): agrees with the report" in body
    assert "| `(4096, 1024) float32` | 1.840x | 1.766x |" in body
    assert "Candidate `cccccccccc`" in body


def _flagged(speedup: float = 14.0) -> Evaluation:
    flag = Finding("physics-floor", "physics", "warn",
                   f"{speedup:.1f}x faster than the original, over the 10x review threshold: "
                   "a person must review it before it is merged", "(4096, 1024) float32")
    return replace(_evaluation(speedup), findings=(flag,))


def test_a_flagged_winner_opens_as_a_labelled_draft_with_the_flag_first(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    result = publish(_winner(work, evaluation=_flagged()), _settings(fake_github))
    assert result.operation == "created"
    pr = fake_github.pulls[SLUG][1]
    assert pr["draft"] is True and pr["labels"] == ["kfbot", REVIEW_LABEL]
    lines = pr["body"].splitlines()
    assert lines[0].startswith("**Needs review:** kfbot's physics floor flagged this result")
    assert find_pr_marker(lines[1], KERNEL) is not None
    assert lines[3] == ("- 14.0x faster than the original, over the 10x review threshold: a "
                        "person must review it before it is merged (`(4096, 1024) float32`)")
    assert pr["body"].index("14.0x faster than the original") < pr["body"].index("## Benchmark")


def test_an_open_pull_request_goes_back_to_draft_when_a_flagged_result_lands(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, _ = repos
    publish(_winner(work), _settings(fake_github))
    assert fake_github.pulls[SLUG][1]["draft"] is False
    fake_github.clear_calls()
    updated = publish(_winner(work, text=FASTER, evaluation=replace(
        _flagged(), candidate="d" * 64)), _settings(fake_github))
    assert updated.operation == "updated"
    assert fake_github.pulls[SLUG][1]["draft"] is True
    assert REVIEW_LABEL in fake_github.pulls[SLUG][1]["labels"]
    assert "POST /graphql" in fake_github.endpoints()


def test_review_gate_block_keeps_a_flagged_winner_unpublished(
        repos: tuple[Path, Path], fake_github: FakeGitHub) -> None:
    work, remote = repos
    result = publish(_winner(work, evaluation=_flagged()),
                     _settings(fake_github, review_gate="block"))
    assert result.operation == "skipped"
    assert result.message.startswith("not published: the physics floor flagged it for review "
                                     "and github.review_gate is block: [physics-floor] 14.0x")
    assert fake_github.calls == [] and _remote_head(remote, BRANCH) is None
