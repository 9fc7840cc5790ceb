"""Read a candidate given on the command line: a folder of changed files or a patch."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate


def load_candidate(path: Path, root: Path, editable: Sequence[str]) -> Candidate:
    """A folder mirrors repository paths; a .patch/.diff applies to the repository;
    a single source file replaces the editable file of the same name."""
    if not path.exists():
        raise KfbotError(f"{path}: no such candidate file or folder")
    if path.is_dir():
        files = {
            p.relative_to(path).as_posix(): p.read_text()
            for p in sorted(path.rglob("*"))
            if p.is_file()
        }
    elif path.suffix in (".patch", ".diff"):
        files = _apply_patch(path, root)
    else:
        files = {_editable_named(path.name, editable, path): path.read_text()}
    if not files:
        raise KfbotError(f"{path}: the candidate changes no files")
    return Candidate(files=files, origin="user", rationale=f"given on the command line: {path}")


def _editable_named(name: str, editable: Sequence[str], path: Path) -> str:
    matches = [e for e in editable if Path(e).name == name]
    if len(matches) != 1:
        listed = ", ".join(editable) or "none"
        raise KfbotError(
            f"{path}: name the file it replaces by giving a folder that mirrors "
            f"the repository (editable files: {listed})"
        )
    return matches[0]


def _apply_patch(patch: Path, root: Path) -> dict[str, str]:
    """Apply to copies of the touched files; the user's working tree is never written."""
    touched = _patched_paths(patch.read_text(errors="replace"))
    with tempfile.TemporaryDirectory(prefix="kfbot-patch-") as tmp:
        for rel in touched:
            src, dst = root / rel, Path(tmp) / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_file():
                shutil.copyfile(src, dst)
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(patch.resolve())],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise KfbotError(f"{patch}: does not apply: {proc.stderr.strip().splitlines()[0]}")
        return {
            rel: (Path(tmp) / rel).read_text() for rel in touched if (Path(tmp) / rel).is_file()
        }


def _patched_paths(text: str) -> list[str]:
    paths = []
    for line in text.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            name = line[4:].split("\t")[0].strip()
            paths.append(name[2:] if name.startswith(("a/", "b/")) else name)
    return list(dict.fromkeys(paths))
