"""What the GPU job hands the publish job: a folder the workflow uploads as an artifact.

    <folder>/handoff.json                  the event, the job's result, the status to post
    <folder>/<kernel>/publication.json     one winner: its numbers, its hash, its base
    <folder>/<kernel>/best.patch           the winner's patch: what the publish job commits
    <folder>/<kernel>/report.md, ...       the run folder's report, for people

The job that runs the search (and the repository's code, and the candidates) holds no
token that can write to GitHub; it writes this folder instead. The publish job, on a
runner where no code of the repository runs, reads it as untrusted input: files are
read without following links and only up to a size, counts are bounded, every JSON
value is checked against its type (`wire`), and each publication is re-checked against
the repository (`recheck`) before one byte of it is committed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfbot.anticheat.adequacy import Adequacy
from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.reproduce.model import Reproduction
from kfbot.github.action_io import Result
from kfbot.github.status import StatusReport
from kfbot.github.wire import WireError, dump, load
from kfbot.search.archive import Individual
from kfbot.search.experience import Lesson

if TYPE_CHECKING:
    from kfbot.github.publish import Winner

SCHEMA = 1
MANIFEST = "handoff.json"
PUBLICATION = "publication.json"
PATCH = "best.patch"
# Bounds on what the publish job reads: generous for any real run, small enough that a
# planted folder cannot make the job read or send without end.
MAX_MANIFEST_BYTES = 4 << 20
MAX_PUBLICATION_BYTES = 16 << 20
MAX_PATCH_BYTES = 1 << 20
MAX_PUBLICATIONS = 64
# The run folder's files that travel for people to download (never read by publish).
FOR_PEOPLE = ("report.md", "report.json", "reproduction.json", "progress.png")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,119}")


class HandoffError(KfbotError):
    """The folder is not a handoff kfbot wrote, or breaks a bound; the message says which."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


@dataclass(frozen=True)
class Publication:
    """One verified winner as the publish job re-checks and commits it. Paths are
    relative to `root`, the task's folder inside the repository."""

    kernel_id: str
    kernel_name: str
    base_commit: str  # the commit the run measured on; the patch applies to it
    root: str  # "" or "sub/dir/"
    editable: tuple[str, ...]  # the task's editable files
    files: tuple[str, ...]  # the candidate's files: its content hash covers exactly these
    candidate: str  # that hash: the evaluation's and the reproduction's numbers are of it
    patch_sha256: str  # of best.patch, as written
    evaluation: Evaluation
    reproduction: Reproduction | None
    rationale: str = ""
    lessons: tuple[Lesson, ...] = ()
    adequacy: Adequacy | None = None
    history: tuple[Individual, ...] = ()
    islands: int = 1


@dataclass(frozen=True)
class Manifest:
    """What the GPU job did, for the publish job to post."""

    schema: int
    repository: str  # owner/name
    event: str  # the event name: the publish job runs in the same workflow run
    run_id: str
    head: str | None  # the commit the job checked out
    result: Result
    status: StatusReport | None = None  # the status comment's last word, if one is kept
    status_if_exists: bool = False  # only update a status comment an earlier run wrote
    publications: tuple[str, ...] = ()  # folder names, one per winner


@dataclass(frozen=True)
class Handed:
    """One publication as read back: its record and its patch, or why it cannot be."""

    name: str
    publication: Publication | None
    patch: str
    problem: str | None = None


# ---- the GPU job's side ------------------------------------------------------------------


class Recorder:
    """What the GPU job would have written to GitHub, kept for the publish job: the
    winners, and the last word of the status comment (`show`, as `StatusComment` has)."""

    def __init__(self, folder: Path) -> None:
        self.folder = start(folder)
        self.publications: list[str] = []
        self.status: StatusReport | None = None
        self.status_if_exists = False

    def add(self, publication: Publication, patch: str, run_dir: Path) -> None:
        self.publications.append(add_publication(self.folder, publication, patch, run_dir))

    def show(self, report: StatusReport) -> None:
        self.status, self.status_if_exists = dataclasses.replace(report), False

    def show_if_exists(self, report: StatusReport) -> None:
        self.status, self.status_if_exists = dataclasses.replace(report), True

    def finish(self, repository: str, event: str, run_id: str, head: str | None,
               result: Result, redact: Callable[[str], str]) -> None:
        """The manifest, every text in it redacted."""
        status = self.status
        if status is not None:
            status = dataclasses.replace(status, headline=redact(status.headline),
                                         details=redact(status.details),
                                         steps=[redact(step) for step in status.steps])
        result = dataclasses.replace(result, headline=redact(result.headline),
                                     details=redact(result.details), annotations=tuple(
                                         dataclasses.replace(a, message=redact(a.message))
                                         for a in result.annotations))
        write_manifest(self.folder, Manifest(SCHEMA, repository, event, run_id, head, result,
                                             status, self.status_if_exists,
                                             tuple(self.publications)))


def publication_of(winner: Winner, base_commit: str, root: str,
                   editable: tuple[str, ...], patch: str) -> Publication:
    """What the publish job needs of a verified winner, with the patch's hash."""
    ev = winner.evaluation
    return Publication(winner.kernel_id, winner.kernel_name, base_commit, root, editable,
                       tuple(sorted(winner.files)), ev.candidate, patch_digest(patch), ev,
                       winner.reproduction, winner.rationale, winner.lessons, winner.adequacy,
                       winner.history, winner.islands)


def start(folder: Path) -> Path:
    """An empty handoff folder, made before any untrusted code runs (anything an earlier
    step left there is removed; a link in its place is refused)."""
    if folder.is_symlink():
        raise HandoffError(f"{folder}: the handoff folder is a symbolic link: give a plain "
                           "folder under $RUNNER_TEMP")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def add_publication(folder: Path, publication: Publication, patch: str,
                    run_dir: Path) -> str:
    """Write one winner into the handoff; its folder's name."""
    name = publication_name(publication.kernel_id)
    place = folder / name
    place.mkdir(exist_ok=True)
    data = patch.encode("utf-8")
    (place / PATCH).write_bytes(data)
    if hashlib.sha256(data).hexdigest() != publication.patch_sha256:
        raise AssertionError("the publication's patch hash is not of the patch written")
    _write_json(place / PUBLICATION, dump(publication))
    for extra in FOR_PEOPLE:
        source = run_dir / extra
        if source.is_file() and not source.is_symlink():
            shutil.copyfile(source, place / extra)
    return name


def write_manifest(folder: Path, manifest: Manifest) -> None:
    _write_json(folder / MANIFEST, dump(manifest))


def publication_name(kernel_id: str) -> str:
    """A folder name for the kernel: letters, digits, `.`, `_` and `-` only."""
    flat = re.sub(r"[^A-Za-z0-9._-]+", "-", kernel_id.replace("::", "-")).strip("-.")
    return (flat[:100] or "kernel") + "-" + hashlib.sha256(kernel_id.encode()).hexdigest()[:8]


def patch_digest(patch: str) -> str:
    return hashlib.sha256(patch.encode("utf-8")).hexdigest()


def _write_json(path: Path, data: Any) -> None:
    # ASCII escapes: a name that is not UTF-8 (lone surrogates) travels as `\udcNN`.
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="ascii")


# ---- the publish job's side --------------------------------------------------------------


def read_manifest(folder: Path) -> Manifest:
    """The handoff's manifest, checked; a HandoffError naming the file and what is wrong."""
    path = folder / MANIFEST
    data = _json(read_bounded(path, MAX_MANIFEST_BYTES), path)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise HandoffError(f"{path}: written by another kfbot version (schema {found!r}, "
                           f"this kfbot reads {SCHEMA}): use the same kfbot version in both "
                           "jobs")
    try:
        manifest = load(Manifest, data, MANIFEST)
    except WireError as exc:
        raise HandoffError(f"{path}: {exc}") from None
    if len(manifest.publications) > MAX_PUBLICATIONS:
        raise HandoffError(f"{path}: {len(manifest.publications)} publications, more than "
                           f"the {MAX_PUBLICATIONS} kfbot reads")
    for name in manifest.publications:
        if not _NAME.fullmatch(name):
            raise HandoffError(f"{path}: publication folder {name!r} is not a plain name")
    return manifest


def read_publication(folder: Path, name: str) -> Handed:
    """One publication and its patch; a problem (a value) when either is unreadable."""
    place = folder / name
    try:
        data = _json(read_bounded(place / PUBLICATION, MAX_PUBLICATION_BYTES),
                     place / PUBLICATION)
        publication = load(Publication, data, f"{name}/{PUBLICATION}")
        raw = read_bounded(place / PATCH, MAX_PATCH_BYTES)
    except (HandoffError, WireError) as exc:
        return Handed(name, None, "", str(exc))
    if hashlib.sha256(raw).hexdigest() != publication.patch_sha256:
        return Handed(name, publication, "", f"{name}/{PATCH} is not the patch the run "
                      "recorded (its SHA-256 differs from publication.json's patch_sha256)")
    try:
        return Handed(name, publication, raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Handed(name, publication, "", f"{name}/{PATCH}: not UTF-8 ({exc.reason} at "
                      f"byte {exc.start})")


def read_bounded(path: Path, limit: int) -> bytes:
    """A regular file's bytes, not through a link, at most `limit` of them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise HandoffError(f"{path}: missing") from None
    except OSError as exc:
        raise HandoffError(f"{path}: cannot be read ({exc.strerror}); a link is refused"
                           ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise HandoffError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise HandoffError(f"{path}: {info.st_size} bytes, more than the {limit} kfbot "
                               "reads")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise HandoffError(f"{path}: more than the {limit} bytes kfbot reads")
    return data


def _json(raw: bytes, path: Path) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HandoffError(f"{path}: not valid JSON: {exc}") from None
