"""Publishing a winner the GPU job handed over: re-checked, committed by the API.

    result = publish_handed(handed, pin, target, settings)   # PublishResult or Refusal

The publication is re-checked against the pinned base commit read through the API
(`recheck`): its patch applies exactly, touches only the task's editable files, and
makes the files whose hash the report's numbers are of. The pinned commit must still
be where the run found it: the head of the branch kfbot's pull request goes to, or of
the commented pull request. The commit is then made by GitHub from the re-checked
bytes (`gitdata`), and the pull request is opened or updated as `kfbot optimize
--publish` does (`publish.PullRequests`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.errors import EXIT_FAILURE, KfbotError
from kfbot.github.authorize import read_head
from kfbot.github.gitdata import GitData
from kfbot.github.handoff import Handed, Publication
from kfbot.github.publish import (
    PublishResult,
    PublishSettings,
    PullRequests,
    Target,
    Winner,
    refusal,
)
from kfbot.github.recheck import REGULAR, Change, Refusal, recheck, repository_paths, static_refusal
from kfbot.search.branch import TRAILER, Commit, pr_branch
from kfbot.search.experience import DEFAULT_PATH, Lesson, append_lessons, read_lessons


@dataclass(frozen=True)
class Pin:
    """Where the run's base must still be: its commit at the head of `branch`, or, for a
    comment command, at the head of pull request `pull`."""

    commit: str
    branch: str  # the branch kfbot's pull request is opened against
    pull: int | None = None


class BaseMoved(KfbotError):
    """The base commit the run measured on is no longer where the run found it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_FAILURE)


def publish_handed(handed: Handed, pin: Pin, target: Target,
                   settings: PublishSettings) -> PublishResult | Refusal:
    """Re-check one publication, then commit it and open or update its pull request."""
    pub = handed.publication
    if pub is None or handed.problem:
        return Refusal(handed.name, handed.problem or "no publication")
    refused = static_refusal(handed.name, pub, handed.patch)
    if refused is not None:
        return refused
    if pub.base_commit != pin.commit:
        return Refusal(handed.name, f"the run measured on {pub.base_commit[:10]}, but the job "
                       f"checked out {pin.commit[:10]}")
    data = GitData(target.repo, settings.retry)
    moved = _moved(data, pin, target)
    if moved:
        return Refusal(handed.name, moved)
    base = data.base_files(pin.commit, repository_paths(pub))
    checked = recheck(handed.name, pub, handed.patch, base)
    if isinstance(checked, Refusal):
        return checked
    winner = winner_of(pub, checked.changes)
    why = refusal(winner, settings.github)
    if why is not None:
        return PublishResult("skipped", f"not published: {why}", pr_branch(pub.kernel_id))
    branches = ApiBranches(data, pin, target, pub.root,
                           {c.path: c.mode for c in checked.changes})
    try:
        return PullRequests(winner, settings, target, branches).run()
    except BaseMoved as exc:
        return Refusal(handed.name, str(exc))


def winner_of(pub: Publication, changes: Sequence[Change]) -> Winner:
    """The Winner the pull request describes: the publication's numbers and the files the
    re-check made (paths relative to the task root)."""
    files = {c.path.removeprefix(pub.root): c.text for c in changes}
    return Winner(Path(pub.root or "."), pub.kernel_id, pub.kernel_name, files,
                  pub.evaluation, pub.rationale, pub.lessons, pub.adequacy, pub.history,
                  pub.islands, pub.reproduction)


def _moved(data: GitData, pin: Pin, target: Target) -> str | None:
    """Why the pinned commit is no longer the base, or None when it still is."""
    if pin.pull is not None:
        head = read_head(target.repo, pin.pull, data.retry)
        if head.sha != pin.commit:
            return (f"the head of pull request #{pin.pull} moved from {pin.commit[:7]} to "
                    f"{head.short} after the run began; nothing was published: comment again "
                    "to run on the new head")
        return None
    now = data.ref(pin.branch)
    if now != pin.commit:
        shown = now[:10] if now else "deleted"
        return (f"the base branch {pin.branch} moved from {pin.commit[:10]} to {shown} after "
                "the run began: its numbers were measured on the old base, so nothing was "
                "published; run again")
    return None


class ApiBranches:
    """`publish.Branches` through the Git Data API, on the pinned base commit."""

    def __init__(self, data: GitData, pin: Pin, target: Target, root: str,
                 modes: Mapping[str, str]) -> None:
        self.data, self.pin, self.target = data, pin, target
        self.root, self.modes = root, modes

    def state(self, base: str, branch: str) -> tuple[str, str | None]:
        moved = _moved(self.data, self.pin, self.target)  # again, right before committing
        if moved:
            raise BaseMoved(moved)
        return self.pin.commit, self.data.ref(branch)

    def foreign(self, base_sha: str, head: str, kernel_id: str) -> list[str]:
        return self.data.foreign(base_sha, head, TRAILER, kernel_id)

    def commit(self, base_sha: str, files: Mapping[str, str], message: str,
               lessons: Sequence[Lesson]) -> Commit:
        changes = [Change(self.root + rel, self.modes.get(self.root + rel, "100644"), text)
                   for rel, text in sorted(files.items())]
        experience, added = self._lessons(base_sha, lessons)
        sha, tree = self.data.commit(base_sha, [*changes, *experience], message)
        return Commit(sha, tree, added)

    def tree(self, sha: str) -> str:
        return self.data.tree_of(sha)

    def move(self, branch: str, sha: str, expected: str | None) -> bool:
        return self.data.move(branch, sha, expected)

    def _lessons(self, base_sha: str, lessons: Sequence[Lesson]
                 ) -> tuple[list[Change], tuple[Lesson, ...]]:
        """The experience file with the run's lessons added, as the base has it."""
        if not lessons:
            return [], ()
        path = self.root + DEFAULT_PATH.as_posix()
        found = self.data.base_files(base_sha, [path])[path]
        if found.mode is not None and found.mode not in REGULAR:
            return [], ()  # a link or a folder there is not kfbot's to replace
        with tempfile.TemporaryDirectory(prefix="kfbot-lessons-") as tmp:
            local = Path(tmp) / "experience.md"
            if found.text is not None:
                local.write_text(found.text, encoding="utf-8")
            before = set(read_lessons(local)) if local.is_file() else set()
            append_lessons(local, lessons)
            text = local.read_text(encoding="utf-8")
        added = tuple(lesson for lesson in lessons if lesson not in before)
        if text == found.text:
            return [], added
        return [Change(path, found.mode or "100644", text)], added
