"""Read a candidate given on the command line: a folder of changed files or a patch."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kfbot import git
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.paths import inside, plain_relative
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
    touched = patched_paths(patch.read_text(errors="replace"), str(patch))
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


# Header lines that name a file a patch reads or writes, and whether git's `a/`, `b/`
# prefix comes before the name.
_NAMING = (("--- ", True), ("+++ ", True), ("rename from ", False), ("rename to ", False),
           ("copy from ", False), ("copy to ", False))


def patched_paths(text: str, where: str) -> list[str]:
    """The files the patch writes, each a plain relative path. Every file it names is
    checked before anything is copied or created: an absolute path or a `..` part is a
    KfbotError naming `where` (a patch must not make kfbot write outside its copy)."""
    written = []
    for line in text.splitlines():
        for head, prefixed in _NAMING:
            if line.startswith(head):
                name = _name(line[len(head):], prefixed)
                if name is not None:
                    plain_relative(name, where)
                    if head in ("+++ ", "rename to ", "copy to "):
                        written.append(name)
    return list(dict.fromkeys(written))


def _name(field: str, prefixed: bool) -> str | None:
    name = field.split("\t")[0].strip()
    if name.startswith('"') and name.endswith('"'):
        name = name[1:-1]  # git quotes a name with unusual characters
    if name == "/dev/null":
        return None
    return name[2:] if prefixed and name.startswith(("a/", "b/")) else name
