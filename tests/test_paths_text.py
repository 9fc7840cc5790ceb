"""Reading only inside the repository, byte-exact sources, and text fit to be echoed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kfbot.errors import KfbotError
from kfbot.paths import copy_repository, inside, refuse_link, resolve_inside
from kfbot.text import NotUtf8Error, decode_source, read_source, shown, write_source


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "csrc").mkdir(parents=True)
    (root / "csrc" / "k.cu").write_text("__global__ void k() {}\n")
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "token.txt").write_text("ghp_secret\n")
    os.symlink(outside / "token.txt", root / "csrc" / "leak.cu")
    os.symlink(outside, root / "elsewhere")
    os.symlink("/", root / "rootfs")
    os.symlink("..", root / "csrc" / "loop")
    os.symlink("k.cu", root / "csrc" / "alias.cu")
    os.symlink("missing.cu", root / "csrc" / "broken.cu")
    return root


def test_inside_follows_links(repo: Path) -> None:
    assert inside(repo, repo / "csrc" / "k.cu")
    assert inside(repo, repo / "csrc" / "alias.cu")
    assert not inside(repo, repo / "csrc" / "leak.cu")
    assert not inside(repo, repo / "rootfs")
    assert not inside(repo / "csrc", repo / "csrc" / "loop")
    with pytest.raises(KfbotError, match="leads outside the repository"):
        resolve_inside(repo, "elsewhere/token.txt")


def test_a_copy_holds_real_files_from_inside_only(repo: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    report = copy_repository(repo, dest)
    assert (dest / "csrc" / "k.cu").read_text() == "__global__ void k() {}\n"
    alias = dest / "csrc" / "alias.cu"
    assert alias.is_file() and not alias.is_symlink()
    assert not (dest / "csrc" / "leak.cu").exists()
    assert not (dest / "elsewhere").exists() and not (dest / "rootfs").exists()
    assert not any("ghp_secret" in p.read_text() for p in dest.rglob("*") if p.is_file())
    said = "\n".join(report.skipped)
    for rel in ("csrc/leak.cu", "elsewhere", "rootfs", "csrc/loop", "csrc/broken.cu"):
        assert rel in said


def test_a_linked_settings_file_is_refused(repo: Path) -> None:
    os.symlink(repo / "csrc" / "leak.cu", repo / "kfbot.yaml")
    with pytest.raises(KfbotError, match="symbolic link"):
        refuse_link(repo / "kfbot.yaml", "config")


def test_sources_round_trip_byte_for_byte(tmp_path: Path) -> None:
    data = "// größe\r\n__global__ void k() {}\r\n".encode()
    path = tmp_path / "k.cu"
    path.write_bytes(data)
    text = read_source(path, "k.cu")
    write_source(path, text)
    assert path.read_bytes() == data


def test_a_source_that_is_not_utf8_is_refused_with_its_place() -> None:
    with pytest.raises(NotUtf8Error, match=r"csrc/k\.cu:2:4: not valid UTF-8 \(byte 0xe9\)"):
        decode_source(b"ok\n// \xe9t\xe9\n", "csrc/k.cu")


def test_shown_escapes_and_cuts() -> None:
    assert shown("softmax\x1b[31m\n") == "softmax\\x1b[31m\\n"
    long = shown("a" * 2_000_000)
    assert len(long) == 80 and long.endswith("…")
    assert shown("plain") == "plain"
