"""What running the repository's tests on a GPU showed, merged into a scan report.

The static reading pairs kernels with tests by following code; on a machine with a
GPU, kfbot also watches (`kfbot.evaluate.observe`): which kernels each test launched,
through which ops, and whether the test fails when the kernel writes nothing (one
mutant per kernel). Those results, `Observations`, are kept per commit and merged here:
every kernel lists the tests seen launching it (`Kernel.observed`), and a test that the
mutant fails becomes a reference of origin "observed" where the static reading had
not paired it. A test the mutant does not fail ("launches but does not check") is
never a reference.

Observations are kept in the repository's `.kfbot/observed/`, one file per state: the
commit checked out plus, when the working tree differs from it, a hash of the
difference (tracked changes and untracked files, `.kfbot/` left out, since kfbot
writes there itself): `3f2a...c1` or `3f2a...c1-dirty-5e0b7d21a9f4`. An observation says
what the tests did with exactly that code; any other state has its own file. A folder
that is not a git working tree has no state to key by: nothing is kept.

The records are in `kfbot.scan.model`; here are their JSON form, the files they are
kept in and the merge. Nothing here runs the repository's code or imports torch:
`kfbot scan` reads these files.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from kfbot import git
from kfbot.errors import KfbotError
from kfbot.scan.model import (
    Kernel,
    Observations,
    ObservedTest,
    ReferenceTest,
    ScanReport,
    Verdict,
    evolve,
)

FORMAT = 1
VERDICTS: tuple[Verdict, ...] = ("checks", "launches-only", "unconfirmed", "fails-on-original")


def test_to_json(t: ObservedTest) -> dict[str, Any]:
    return {"test": t.test, "kind": t.kind, "ops": list(t.ops), "verdict": t.verdict,
            "why": t.why}


def test_from_json(data: Mapping[str, Any]) -> ObservedTest:
    said = str(data.get("verdict", ""))
    verdict: Verdict = next((v for v in VERDICTS if v == said), "unconfirmed")
    kind: Literal["pytest", "script"] = "script" if data.get("kind") == "script" else "pytest"
    return ObservedTest(str(data["test"]), kind, tuple(map(str, data.get("ops", []))),
                        verdict, str(data.get("why", "")))


def to_json(o: Observations) -> dict[str, Any]:
    return {"format": FORMAT, "key": o.key,
            "kernels": {k: [test_to_json(t) for t in tests] for k, tests in o.kernels},
            "files": list(o.files), "foreign": list(o.foreign), "note": o.note,
            "tests_run": o.tests_run}


def from_json(data: Mapping[str, Any]) -> Observations:
    """Raises ValueError on a file of another format or shape."""
    if data.get("format") != FORMAT:
        raise ValueError(f"observations of format {data.get('format')!r}, not {FORMAT}")
    try:
        kernels = data.get("kernels", {})
        return Observations(
            key=str(data["key"]),
            kernels=tuple((str(k), tuple(test_from_json(t) for t in v))
                          for k, v in kernels.items()),
            files=tuple(map(str, data.get("files", []))),
            foreign=tuple(map(str, data.get("foreign", []))),
            note=str(data.get("note", "")),
            tests_run=int(data.get("tests_run", 0)),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"observations: {exc}") from exc


def with_observations(report: ScanReport, observed: Observations, root: Path) -> ScanReport:
    """The report with each kernel's observed tests; the tests the mutant confirmed
    added as references of origin "observed" where the static reading missed them, and
    the static references the mutant showed do not check the kernel taken out."""
    kernels = tuple(_kernel(k, observed.of(k.id), root) for k in report.kernels)
    return evolve(report, kernels=kernels, observed=observed)


def _kernel(kernel: Kernel, tests: Sequence[ObservedTest], root: Path) -> Kernel:
    if not tests:
        return kernel
    verdicts: dict[tuple[str, str], set[str]] = {}
    for t in tests:
        file, name = _file_and_name(t)
        verdicts.setdefault((file, name.split(".")[0]), set()).add(t.verdict)
    # A static reference whose test was seen launching the kernel without checking it
    # (every observed run of it passed the mutant) is no reference.
    kept = [r for r in kernel.references
            if verdicts.get((r.file, r.test.split(".")[0])) != {"launches-only"}]
    known = {(r.file, r.test.split(".")[0]) for r in kept}
    added = []
    for t in tests:
        file, name = _file_and_name(t)
        if t.verdict != "checks" or (file, name.split(".")[0]) in known:
            continue
        known.add((file, name.split(".")[0]))
        added.append(observed_reference(t, file, name, root))
    return evolve(kernel, observed=tuple(tests), references=(*kept, *added))


def _file_and_name(test: ObservedTest) -> tuple[str, str]:
    if test.kind == "script":
        return test.test, "<module>"
    file, _, rest = test.test.partition("::")
    return file, re.sub(r"\[.*\]$", "", rest).replace("::", ".")


def observed_reference(test: ObservedTest, file: str, name: str, root: Path) -> ReferenceTest:
    op = test.ops[0] if test.ops else ""
    return ReferenceTest(
        file=file, line=_line_of(root / file, name), test=name, kind=test.kind, op=op,
        op_name=op.rsplit(".", 1)[-1], module_hint=op.rsplit(".", 1)[0] if "." in op else None,
        reference=None, comparison="the test's own (a mutant of the kernel fails it)",
        why=f"observed on a GPU: {test.line()}", confidence=1.0, origin="observed")


def _line_of(path: Path, name: str) -> int:
    """The line of the test function or class `name` ("TestX.test_y"), else 0."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return 0
    wanted = name.split(".")[-1]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.name == wanted:
            return node.lineno
    return 0


# --- kept per state ----------------------------------------------------------------------

FOLDER = Path(".kfbot") / "observed"
_HASHED_BYTES = 1 << 20
_EXCLUDE = ":(exclude).kfbot"


def state_key(root: Path) -> str | None:
    """The commit and dirty state of the working tree at `root`; None outside git or
    before the first commit."""
    try:
        git.locate(root)
    except KfbotError:
        return None
    head = git.commit_of(root, "HEAD")
    if head is None:
        return None
    status = git.run(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--",
                     ".", _EXCLUDE)
    if not status:
        return head
    digest = hashlib.sha256(git.run(root, "diff", "HEAD", "--binary", "--", ".", _EXCLUDE))
    untracked = git.run(root, "ls-files", "--others", "--exclude-standard", "-z", "--", ".",
                        _EXCLUDE).split(b"\0")
    for rel in sorted(filter(None, untracked)):
        digest.update(b"\0" + rel + b"\0")
        path = root / os.fsdecode(rel)
        if not path.is_file() or path.is_symlink():
            continue
        stat = path.stat()
        # Large untracked files (data, build outputs) by size and time: reading them all
        # at every scan would cost more than the scan.
        digest.update(path.read_bytes() if stat.st_size <= _HASHED_BYTES
                      else f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{head}-dirty-{digest.hexdigest()[:12]}"


def path_for(root: Path, key: str) -> Path:
    return root / FOLDER / f"{key}.json"


def load(root: Path, key: str | None = None) -> Observations | None:
    """The observation of the tree's current state (or of `key`), if one was kept; an
    unreadable or foreign file counts as none."""
    if key is None and not (root / FOLDER).is_dir():
        return None  # none was ever kept: no need to ask git for the state
    key = key if key is not None else state_key(root)
    if key is None:
        return None
    path = path_for(root, key)
    if not path.is_file() or path.is_symlink():
        return None
    try:
        found = from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
    return found if found.key == key else None


def save(root: Path, observed: Observations) -> Path | None:
    """Keep `observed` under its key; None when the folder is not a git working tree
    (its key is empty then)."""
    if not observed.key:
        return None
    path = path_for(root, observed.key)
    folder = path.parent
    for part in (folder.parent, folder):
        if part.is_symlink():
            raise KfbotError(f"{part} is a symbolic link; kfbot writes observations only "
                             "into a real folder of the repository")
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(to_json(observed), indent=1), encoding="utf-8")
    os.replace(partial, path)
    return path
