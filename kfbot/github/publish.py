"""Publish a verified winner as a pull request: one branch and one PR per kernel.

    result = publish(Winner(root, kernel_id, name, files, evaluation, ...),
                     PublishSettings(github=config.github, repo_slug="octo/kernels"))
    result.operation   # "created" | "updated" | "unchanged" | "skipped" | "dry-run"

The kernel's files and the run's lessons are committed on top of the base branch
(config `github.base`, else the repository's default) and the branch `kfbot/<kernel>`
is moved only if it is where kfbot last saw it, so a branch someone pushed to is never
overwritten. Where the commit is made is a `Branches`: a person's own clone
(`local_clone`, `kfbot optimize --publish`), or, in the GitHub Action's publish job, the
Git Data API from bytes kfbot re-checked (`from_handoff`). Nothing is published unless a
reproduction (`kfbot reproduce`: the patch on a clean copy of the base, timed by a
second timer) came within `TOLERANCE` of the reported speedup. A candidate the physics
floor flagged is published as a draft labelled `REVIEW_LABEL`, with the flag first in
the body, unless `github.review_gate` is `block`. The PR is found again by the
hidden marker in its body, which also records the commit kfbot last pushed: when the
branch's head is anything else, a person has pushed to it, and kfbot leaves branch and
PR alone and says so. `dry_run_dir` writes the body and the diff there instead, with no
network at all.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from github.PullRequest import PullRequest
from github.Repository import Repository

from kfbot.anticheat.adequacy import Adequacy
from kfbot.config import GithubConfig, load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.reproduce.model import TOLERANCE, Reproduction
from kfbot.github.api import DEFAULT_RETRY, GitHubError, Retry, call, connect, find_token
from kfbot.github.api import repository as open_repository
from kfbot.github.local_clone import LocalClone, find_remote, slug_of
from kfbot.github.markers import find_pr_marker, pr_marker
from kfbot.github.prbody import Previous, PrReport, render, run_url, title
from kfbot.paths import kfbot_folder
from kfbot.search.archive import Individual
from kfbot.search.branch import (
    TRAILER,
    Commit,
    commit_detached,
    diff,
    local_base,
    open_repo,
    pr_branch,
)
from kfbot.search.experience import DEFAULT_PATH, Lesson, read_lessons
from kfbot.search.pershape import section as per_shape_section

if TYPE_CHECKING:  # the comment bot imports this module; it must not pull in the engine
    from kfbot.evaluate.task import KernelTask
    from kfbot.search.runner import OptimizeOutcome

T = TypeVar("T")
REVIEW_LABEL = "kfbot: needs review"
CANDIDATE_TRAILER = "Kfbot-Candidate"  # the content hash of the candidate a commit holds
Operation = Literal["created", "updated", "unchanged", "skipped", "dry-run"]
__all__ = ["slug_of"]  # where the remote URL names the repository, for callers of this module


@dataclass(frozen=True)
class Winner:
    """What a run found, as plain values (no GPU needed to publish it)."""

    root: Path  # the task's root: the repository or a folder inside it
    kernel_id: str
    kernel_name: str
    files: Mapping[str, str]  # path relative to `root` -> the new full text
    evaluation: Evaluation
    rationale: str = ""
    lessons: tuple[Lesson, ...] = ()  # the run's lessons, for the experience file
    adequacy: Adequacy | None = None
    history: tuple[Individual, ...] = ()
    islands: int = 1
    reproduction: Reproduction | None = None  # the second timer's figures, required
    per_shape: str = ""  # the "Where it holds" section: captured and held-out shapes

    @property
    def needs_review(self) -> bool:
        return self.evaluation.needs_review


@dataclass(frozen=True)
class PublishSettings:
    github: GithubConfig = field(default_factory=GithubConfig)
    repo_slug: str | None = None  # owner/name; default: from the remote's URL
    remote: str = "origin"
    draft: bool | None = None  # None: github.draft
    dry_run_dir: Path | None = None  # write the body and diff here; no push, no API
    token: str | None = None  # default: $GITHUB_TOKEN, else $GH_TOKEN
    base_url: str | None = None  # default: $GITHUB_API_URL, else api.github.com
    env: Mapping[str, str] | None = None  # default: os.environ
    retry: Retry = DEFAULT_RETRY
    read_interval: float = 0.25  # seconds between API requests (see api.connect)
    write_interval: float = 1.0
    # Applied to the body: the Action's redactor takes its secrets out in every form.
    redact: Callable[[str], str] | None = None


@dataclass(frozen=True)
class PublishResult:
    operation: Operation
    message: str  # one line a person reads
    branch: str
    url: str | None = None
    number: int | None = None
    sha: str | None = None  # the branch head kfbot published
    files: tuple[Path, ...] = ()  # what a dry run wrote
    warnings: tuple[str, ...] = ()  # for a person to act on, e.g. a token left in .git/config

    def outputs(self) -> dict[str, str]:
        """The GitHub Action's outputs."""
        return {"pr-url": self.url or "", "pr-number": str(self.number or ""),
                "pr-operation": self.operation}


def refusal(winner: Winner, cfg: GithubConfig) -> str | None:
    """Why this winner may not be published, or None when it may."""
    ev = winner.evaluation
    if not ev.ok:
        return f"the candidate was rejected at {ev.stage}: {ev.reason}"
    if ev.verdict != "faster":
        return f"the benchmark verdict is {ev.verdict or 'missing'}, not faster"
    if (ev.speedup or 0.0) < cfg.min_speedup:
        return f"{ev.speedup or 0:.2f}x is below github.min_speedup ({cfg.min_speedup:.2f}x)"
    if ev.needs_review and cfg.review_gate == "block":
        flags = "; ".join(f.line() for f in ev.findings if f.layer == "physics")
        return f"the physics floor flagged it for review and github.review_gate is block: {flags}"
    return _unreproduced(winner)


def _unreproduced(winner: Winner) -> str | None:
    """Why the reproduction does not back the report, or None when it does."""
    rep, ev = winner.reproduction, winner.evaluation
    if rep is None:
        return "it was not reproduced (kfbot reproduce)"
    if rep.candidate != ev.candidate:
        return (f"the reproduction is of candidate {rep.candidate[:10]}, the report of "
                f"{ev.candidate[:10]}")
    if not rep.agrees:
        return (f"the reproduction measured {rep.reproduced:.2f}x where the run reported "
                f"{rep.reported:.2f}x, more than {TOLERANCE:.0%} below")
    return None


def publish(winner: Winner, settings: PublishSettings) -> PublishResult:
    """Push the winner's branch and create or update its pull request (or dry-run it)."""
    branch = pr_branch(winner.kernel_id)
    why = refusal(winner, settings.github)
    if why is not None:
        return PublishResult("skipped", f"not published: {why}", branch)
    if settings.dry_run_dir is not None:
        return _dry_run(winner, settings, branch, settings.dry_run_dir)
    env = os.environ if settings.env is None else settings.env
    token = find_token(settings.token, env)  # before any network: say it plainly
    remote = find_remote(winner.root, settings.remote, settings.repo_slug, settings.base_url,
                         env)
    gh = connect(token, settings.base_url, env=env, read_interval=settings.read_interval,
                 write_interval=settings.write_interval)
    repo = open_repository(gh, remote.slug, settings.retry)
    target = Target(repo, remote.slug, settings.github.base or repo.default_branch,
                    remote.warnings)
    return PullRequests(winner, settings, target, LocalClone(winner.root, remote, token)).run()


def publish_after_run(task: KernelTask, outcome: OptimizeOutcome, islands: int,
                      args: argparse.Namespace,
                      reproduction: Reproduction | None) -> PublishResult:
    """`kfbot optimize --publish`: publish the run's winner with the command's options
    (`--repo-slug`, `--remote`, `--draft`, `--publish-dry-run`), the config and the
    reproduction of its run folder."""
    settings = PublishSettings(github=load_config(args.config, task.root).github,
                               repo_slug=args.repo_slug, remote=args.remote, draft=args.draft,
                               dry_run_dir=args.publish_dry_run)
    branch = pr_branch(task.kernel_id)
    if outcome.best is None or outcome.best_candidate is None:
        return PublishResult("skipped", "not published: no correct candidate beat the original",
                             branch)
    if outcome.committed is None:  # the faster ones all need build parameters
        names = ", ".join(sorted(outcome.best_candidate.params)) or "none"
        return PublishResult("skipped", "not published: no candidate that changes files "
                             f"only was faster (the winner sets build parameters: {names}, "
                             "which kfbot cannot commit as file changes)", branch)
    experience = kfbot_folder(task.root, DEFAULT_PATH.name)
    lessons = tuple(lesson for lesson in (read_lessons(experience) if experience.is_file()
                                          else ()) if lesson.kernel == task.kernel_id)
    return publish(winner_of(task, outcome, islands, lessons, reproduction), settings)


def winner_of(task: KernelTask, outcome: OptimizeOutcome, islands: int,
              lessons: tuple[Lesson, ...], reproduction: Reproduction | None) -> Winner:
    """What a run publishes: the candidate it committed, with its reproduction."""
    if outcome.committed is None:
        raise KfbotError(f"{task.kernel_id}: no candidate that changes files only to publish")
    ev, cand = outcome.committed
    held = outcome.held_out.timings if outcome.held_out and outcome.held_out.ok else ()
    holds = per_shape_section(ev.timings, held, outcome.variants,
                              (outcome.held_out_note, outcome.variant_note))
    return Winner(task.root, task.kernel_id, task.kernel_name, dict(cand.files), ev,
                  cand.rationale, lessons, outcome.adequacy, tuple(outcome.result.history),
                  islands, reproduction, per_shape="\n".join(holds))


def commit_message(winner: Winner) -> str:
    ev = winner.evaluation
    return (f"kfbot: {winner.kernel_name} {ev.speedup or 0:.2f}x faster\n\n"
            f"{winner.rationale or 'A faster version of the kernel, verified by kfbot.'}\n\n"
            f"{TRAILER}: {winner.kernel_id}\n{CANDIDATE_TRAILER}: {ev.candidate}\n")


def _report(winner: Winner, commit: Commit, branch: str, base: str,
            previous: Previous | None, env: Mapping[str, str]) -> PrReport:
    return PrReport(winner.kernel_id, winner.kernel_name, winner.evaluation,
                    tuple(sorted(winner.files)), winner.rationale, winner.adequacy,
                    winner.history, winner.islands, commit.lessons_added, base, branch,
                    previous, run_url(env), winner.reproduction, per_shape=winner.per_shape)


def _marker(winner: Winner, sha: str) -> str:
    ev = winner.evaluation
    return pr_marker(winner.kernel_id, sha=sha, candidate=ev.candidate,
                     speedup=f"{ev.speedup or 0:.3f}")


def _dry_run(winner: Winner, settings: PublishSettings, branch: str,
             out: Path) -> PublishResult:
    place = open_repo(winner.root)
    base, base_sha = local_base(place.top, settings.remote, settings.github.base)
    commit = commit_detached(place, base_sha, winner.files, commit_message(winner),
                             winner.lessons)
    env = os.environ if settings.env is None else settings.env
    body = render(_report(winner, commit, branch, base, None, env), _marker(winner, commit.sha))
    out.mkdir(parents=True, exist_ok=True)
    written = (out / "pr-body.md", out / "pr.diff", out / "pr.json")
    written[0].write_text(body)
    written[1].write_text(diff(place.top, base_sha, commit.sha))
    written[2].write_text(json.dumps({
        "title": title(winner.kernel_name, winner.evaluation), "branch": branch, "base": base,
        "labels": _labels(settings, winner), "draft": _draft(settings, winner),
        "candidate": winner.evaluation.candidate,
        "reproduction": winner.reproduction.to_json() if winner.reproduction else None,
        "commit_message": commit_message(winner)}, indent=1) + "\n")
    return PublishResult("dry-run", f"dry run: wrote {out}/pr-body.md, pr.diff and pr.json; "
                         "nothing pushed, GitHub not called", branch, sha=commit.sha,
                         files=written)


def _draft(settings: PublishSettings, winner: Winner) -> bool:
    """A flagged winner always opens as a draft: a person must look before it is merged."""
    if winner.needs_review:
        return True
    return settings.github.draft if settings.draft is None else settings.draft


def _labels(settings: PublishSettings, winner: Winner) -> list[str]:
    labels = list(settings.github.labels)
    if winner.needs_review and REVIEW_LABEL not in labels:
        labels.append(REVIEW_LABEL)
    return labels


def _same_result(previous: Previous | None, ev: Evaluation) -> bool:
    """Whether the PR already reports this very candidate and speedup."""
    return previous is not None and previous.candidate == ev.candidate and \
        previous.speedup == round(ev.speedup or 0.0, 3)


def _previous(pr: PullRequest | None, kernel_id: str) -> Previous | None:
    fields = find_pr_marker(pr.body or "", kernel_id) if pr is not None else None
    if fields is None or "sha" not in fields:
        return None
    try:
        speedup: float | None = float(fields.get("speedup", ""))
    except ValueError:
        speedup = None
    return Previous(speedup, fields.get("candidate", ""), fields["sha"])


class Branches(Protocol):
    """Where the winner's commit is made and its branch moved: a person's clone
    (`local_clone.LocalClone`) or the Git Data API (`from_handoff.ApiBranches`)."""

    def state(self, base: str, branch: str) -> tuple[str, str | None]:
        """The sha to commit on, and the branch's head (None: no such branch)."""

    def foreign(self, base_sha: str, head: str, kernel_id: str) -> list[str]:
        """Commits on `head` since `base_sha` that kfbot did not make for `kernel_id`."""

    def commit(self, base_sha: str, files: Mapping[str, str], message: str,
               lessons: Sequence[Lesson]) -> Commit:
        """A commit of `files` (paths relative to the task's root) and `lessons`."""

    def tree(self, sha: str) -> str:
        """The tree of commit `sha`."""

    def move(self, branch: str, sha: str, expected: str | None) -> bool:
        """Point `branch` at `sha` if it is still at `expected`; False when it moved."""


@dataclass(frozen=True)
class Target:
    """The repository and branch a winner's pull request goes to."""

    repo: Repository
    slug: str
    base: str  # the branch the pull request is opened against
    warnings: tuple[str, ...] = ()  # for a person to act on


class PullRequests:
    """One publish against GitHub; each step reads top down in `run`."""

    def __init__(self, winner: Winner, settings: PublishSettings, target: Target,
                 branches: Branches) -> None:
        self.w, self.s, self.t, self.b = winner, settings, target, branches
        self.branch = pr_branch(winner.kernel_id)
        self.env = os.environ if settings.env is None else settings.env
        self.gh_repo, self.slug, self.base = target.repo, target.slug, target.base
        self.warnings = target.warnings

    def run(self) -> PublishResult:
        return self._publish(self._open_prs())

    def _open_prs(self) -> list[PullRequest]:
        return self._call(lambda: list(self.gh_repo.get_pulls(state="open")),
                          f"listing the open pull requests of {self.gh_repo.full_name}")

    def _publish(self, open_prs: list[PullRequest]) -> PublishResult:
        ours = [p for p in open_prs if find_pr_marker(p.body or "")]
        existing = next((p for p in ours if self._on_branch(p)
                         and find_pr_marker(p.body or "", self.w.kernel_id)), None)
        other = next((p for p in open_prs if self._on_branch(p) and p is not existing), None)
        if other is not None:
            return self._skip(f"pull request #{other.number} already uses branch {self.branch} "
                              "and was not opened by kfbot: leaving it alone", other)
        cap = self.s.github.max_open_prs
        if existing is None and len(ours) >= cap:
            return self._skip(f"{len(ours)} kfbot pull requests are open and "
                              f"github.max_open_prs is {cap}: merge or close one first")
        return self._push_and_write(existing)

    def _push_and_write(self, existing: PullRequest | None) -> PublishResult:
        base_sha, remote_sha = self.b.state(self.base, self.branch)
        previous = _previous(existing, self.w.kernel_id)
        person = self._person_pushed(remote_sha, base_sha, previous) if remote_sha else None
        if person:
            return self._skip(person, existing)
        commit = self.b.commit(base_sha, self.w.files, commit_message(self.w), self.w.lessons)
        same_tree = remote_sha is not None and self.b.tree(remote_sha) == commit.tree
        head = remote_sha if same_tree and remote_sha else commit.sha
        if not same_tree and not self.b.move(self.branch, commit.sha, remote_sha):
            return self._skip(f"branch {self.branch} moved while kfbot was pushing: someone "
                              "else pushed to it; nothing was overwritten", existing)
        if existing is not None and same_tree and _same_result(previous, self.w.evaluation):
            return self._result("unchanged", existing, head, "nothing new for")
        report = _report(self.w, commit, self.branch, self.base, previous, self.env)
        body = render(report, _marker(self.w, head))
        body = self.s.redact(body) if self.s.redact is not None else body
        if existing is None:
            return self._create(body, head)
        return self._update(existing, body, head, pushed=not same_tree, previous=previous)

    def _person_pushed(self, remote_sha: str, base_sha: str,
                       previous: Previous | None) -> str | None:
        """Why the remote branch is not kfbot's to overwrite, or None when it is."""
        if previous is not None:
            if previous.sha == remote_sha:
                return None
            return (f"branch {self.branch} has commits kfbot did not push (head "
                    f"{remote_sha[:10]}, kfbot last pushed {previous.sha[:10]}): not "
                    "overwriting them; merge or close the pull request, or delete the branch, "
                    "for kfbot to publish again")
        foreign = self.b.foreign(base_sha, remote_sha, self.w.kernel_id)
        if foreign:
            return (f"branch {self.branch} exists with {len(foreign)} commit(s) kfbot did not "
                    f"make (e.g. {foreign[0][:10]}): not overwriting it; delete the branch "
                    "for kfbot to publish again")
        return None

    def _create(self, body: str, head: str) -> PublishResult:
        heading = title(self.w.kernel_name, self.w.evaluation)
        what = f"creating the pull request {self.branch} -> {self.base}"
        try:
            pr = self._call(lambda: self.gh_repo.create_pull(
                title=heading, body=body, head=self.branch, base=self.base,
                draft=_draft(self.s, self.w)), what)
        except GitHubError as exc:
            if exc.status != 422 or "already exists" not in exc.detail:
                raise
            found = self._call(lambda: list(self.gh_repo.get_pulls(
                state="open", head=f"{self.slug.split('/')[0]}:{self.branch}")), what)
            if not found:
                raise
            return self._update(found[0], body, head, pushed=True, previous=None)
        self._label(pr)
        return self._result("created", pr, head, "opened")

    def _label(self, pr: PullRequest) -> None:
        labels = _labels(self.s, self.w)
        if labels:
            self._call(lambda: pr.add_to_labels(*labels), f"labelling pull request #{pr.number}")

    def _hold_for_review(self, pr: PullRequest) -> None:
        """An open pull request that now carries a flagged result goes back to draft, so
        it cannot be merged before a person has looked."""
        self._label(pr)
        if not pr.draft:
            self._call(pr.convert_to_draft, f"turning pull request #{pr.number} into a draft")

    def _update(self, pr: PullRequest, body: str, head: str, pushed: bool,
                previous: Previous | None) -> PublishResult:
        heading = title(self.w.kernel_name, self.w.evaluation)
        self._call(lambda: pr.edit(title=heading, body=body),
                   f"updating pull request #{pr.number}")
        if self.w.needs_review:
            self._hold_for_review(pr)
        if pushed:
            before = f"{previous.speedup:.2f}x" if previous and previous.speedup else "the last run"
            note = (f"kfbot pushed a new version ({head[:10]}): {before} → "
                    f"{self.w.evaluation.speedup or 0:.2f}x. The description has the new "
                    "evidence.")
            self._call(lambda: pr.create_issue_comment(note),
                       f"commenting on pull request #{pr.number}")
        return self._result("updated", pr, head, "updated")

    def _on_branch(self, pr: PullRequest) -> bool:
        repo = pr.head.repo
        return pr.head.ref == self.branch and repo is not None and repo.full_name == self.slug

    def _skip(self, why: str, pr: PullRequest | None = None) -> PublishResult:
        return PublishResult("skipped", f"not published: {why}", self.branch,
                             pr.html_url if pr else None, pr.number if pr else None,
                             warnings=self.warnings)

    def _result(self, op: Operation, pr: PullRequest, head: str, said: str) -> PublishResult:
        return PublishResult(op, f"{said} pull request #{pr.number}: {pr.html_url}", self.branch,
                             pr.html_url, pr.number, head, warnings=self.warnings)

    def _call(self, fn: Callable[[], T], what: str) -> T:
        return call(fn, what, self.s.retry)


