"""The facts cache: a file unchanged since the last scan is not read again, a changed
one is, and the report is the same either way."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.scan.cache import FactsCache
from kfbot.scan.files import SourceFile, collect
from kfbot.scan.render import json_text
from kfbot.scan.scanner import scan

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pkg_chain"


def _saved(cache_dir: Path, timeout: float = 10.0) -> Path:
    """The cache is written by a detached process: wait for its file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list((cache_dir / "scan").glob("*.pickle"))
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the scan cache was not written")


def _sources(root: Path) -> dict[str, SourceFile]:
    return {f.rel: f for f in collect(root, Config().scan).files}


def test_unchanged_files_are_reused_and_changed_ones_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))
    cold = scan(root, Config(), cache=True)
    saved = _saved(tmp_path / "cache")
    cache = FactsCache(root)
    sources = _sources(root)
    assert all(cache.lookup(s)[1] is not None for s in sources.values())

    warm = scan(root, Config(), cache=True)
    assert json_text(warm) == json_text(cold) == json_text(scan(root, Config()))

    gelu = root / "csrc" / "gelu.cu"
    gelu.write_text(gelu.read_text().replace("gelu_fwd_kernel", "gelu_forward_kernel"))
    assert FactsCache(root).lookup(_sources(root)["csrc/gelu.cu"])[1] is None
    before = saved.stat().st_mtime_ns
    changed = scan(root, Config(), cache=True)
    assert "gelu_forward_kernel" in {k.name for k in changed.kernels}
    deadline = time.monotonic() + 10
    while saved.stat().st_mtime_ns == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert FactsCache(root).lookup(_sources(root)["csrc/gelu.cu"])[1] is not None


def test_python_facts_are_dropped_when_files_come_or_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))
    scan(root, Config(), cache=True)
    _saved(tmp_path / "cache")
    (root / "fusedact" / "extra.py").write_text("X = 1\n")
    cache = FactsCache(root)
    cache.use_files(_sources(root))
    sources = _sources(root)
    assert cache.lookup(sources["fusedact/ops.py"])[1] is None  # may depend on which exist
    assert cache.lookup(sources["csrc/gelu.cu"])[1] is not None  # depends on its bytes only


def test_an_unreadable_cache_is_no_cache(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))
    scan(root, Config(), cache=True)
    saved = _saved(tmp_path / "cache")
    saved.write_bytes(b"not a pickle")
    assert FactsCache(root).entries == {}
    assert len(scan(root, Config(), cache=True).kernels) == 3
