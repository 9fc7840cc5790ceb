"""Which files a scan reads."""

from __future__ import annotations

import os
from pathlib import Path

from kfbot.config import ScanConfig
from kfbot.scan.files import collect


def _touch(root: Path, rel: str, text: str = "x") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_source_kinds_and_order(tmp_path: Path) -> None:
    for rel in ("b/k.cu", "a/h.cuh", "a/x.cpp", "t.py", "notes.md", "a/lib.so"):
        _touch(tmp_path, rel)
    inv = collect(tmp_path, ScanConfig())
    assert [(f.rel, f.kind) for f in inv.files] == [
        ("a/h.cuh", "cuda"), ("a/x.cpp", "cuda"), ("b/k.cu", "cuda"), ("t.py", "python")]


def test_generated_build_dirs_are_skipped_and_listed(tmp_path: Path) -> None:
    _touch(tmp_path, "csrc/k.cu")
    _touch(tmp_path, "build/temp.linux/k.cu")
    _touch(tmp_path, "jit/inline_ext/cuda.cu")
    _touch(tmp_path, "jit/inline_ext/build.ninja")
    _touch(tmp_path, ".venv/lib/x.py")
    inv = collect(tmp_path, ScanConfig())
    assert [f.rel for f in inv.files] == ["csrc/k.cu"]
    assert inv.skipped_dirs == ("build", "jit/inline_ext")


def test_symlink_loops_are_reported_not_followed(tmp_path: Path) -> None:
    _touch(tmp_path, "a/k.cu")
    os.symlink(".", tmp_path / "loop")
    os.symlink("../a", tmp_path / "a" / "back")
    inv = collect(tmp_path, ScanConfig())
    assert [f.rel for f in inv.files] == ["a/k.cu"]
    assert sorted(p.file for p in inv.problems) == ["a/back", "loop"]
    assert all("symlink loop" in p.message for p in inv.problems)


def test_broken_symlink_is_a_problem(tmp_path: Path) -> None:
    os.symlink("missing.cu", tmp_path / "dangling.cu")
    inv = collect(tmp_path, ScanConfig())
    assert inv.files == ()
    assert [(p.file, p.message) for p in inv.problems] == [
        ("dangling.cu", "broken symlink; skipped")]


def test_include_and_exclude_globs(tmp_path: Path) -> None:
    for rel in ("csrc/a.cu", "third_party/cutlass/b.cu", "tests/test_a.py", "docs/gen.py"):
        _touch(tmp_path, rel)
    config = ScanConfig(include=("csrc/**", "tests/**", "third_party/**"),
                        exclude=("third_party/**",))
    assert [f.rel for f in collect(tmp_path, config).files] == ["csrc/a.cu", "tests/test_a.py"]


def test_a_file_reached_through_links_is_listed_once(tmp_path: Path) -> None:
    _touch(tmp_path, "real/src/k.cu")
    _touch(tmp_path, "real/src/h.cuh")
    os.symlink("src", tmp_path / "real" / "alias")  # a linked folder
    os.symlink("src/k.cu", tmp_path / "real" / "z.cu")  # a linked file
    os.symlink("real", tmp_path / "root")  # the root itself reached through a link
    inv = collect(tmp_path / "root", ScanConfig())
    # The walk is sorted: what the links reach first is listed, its other names are not.
    assert [f.rel for f in inv.files] == ["alias/h.cuh", "alias/k.cu"]
    assert inv.problems == ()


def test_each_file_is_handed_on_as_it_is_found(tmp_path: Path) -> None:
    for rel in ("b/k.cu", "a/h.cuh", "t.py", "notes.md"):
        _touch(tmp_path, rel)
    found: list[str] = []
    inv = collect(tmp_path, ScanConfig(), on_file=lambda f: found.append(f.rel))
    assert found == [f.rel for f in inv.files] == ["a/h.cuh", "b/k.cu", "t.py"]
