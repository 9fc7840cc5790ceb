"""Read a candidate given on the command line: a folder of changed files or a patch."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kfbot import git
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.paths import inside
from kfbot.text import read_source


def load_candidate(path: Path, root: Path, editable: Sequence[str]) -> Candidate:
    """A folder mirrors repository paths; a .patch/.diff applies to the repository;
    a single source file replaces the editable file of the same name."""
    if not path.exists():
        raise KfbotError(f"{path}: no such candidate file or folder")
    if path.is_dir():
        files = {
            p.relative_to(path).as_posix(): read_source(p, str(p))
            for p in sorted(path.rglob("*"))
            if p.is_file() and inside(path, p)
        }
    elif path.suffix in (".patch", ".diff"):
        files = _apply_patch(path, root)
    else:
        files = {_editable_named(path.name, editable, path): read_source(path, str(path))}
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
            if src.is_file() and inside(root, src):
                shutil.copyfile(src, dst)
        try:
            git.run(Path(tmp), "apply", "--whitespace=nowarn", str(patch.resolve()))
        except git.GitError as exc:
            raise KfbotError(f"{patch}: does not apply: {exc}") from None
        return {rel: read_source(Path(tmp) / rel, rel) for rel in touched
                if (Path(tmp) / rel).is_file()}


def _patched_paths(text: str) -> list[str]:
    paths = []
    for line in text.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            name = line[4:].split("\t")[0].strip()
            paths.append(name[2:] if name.startswith(("a/", "b/")) else name)
    return list(dict.fromkeys(paths))
