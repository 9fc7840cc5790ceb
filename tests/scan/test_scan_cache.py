"""`kfbot scan` keeps each file's facts in the kfbot cache, the folder the pre-commit
hook reads, and prints the same report from them; `--no-cache` neither reads nor
writes it. Without the cache, nothing of one scan is kept for the next."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kfbot.cli import main
from kfbot.config import Config
from kfbot.scan.scanner import scan

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pkg_chain"
KERNEL = """\
__global__ void scale_kernel(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2; }
void scale(float* x, int n) { scale_kernel<<<1, 128>>>(x, n); }
"""
OPS = """\
from torch.utils.cpp_extension import load

ext = load(name="scale_ext", sources=["scale.cu"])
"""


def _scan(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> str:
    assert main(["scan", "--repo", str(root), "--json", *extra]) == 0
    return capsys.readouterr().out


def _entries(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_the_cli_scan_reads_back_the_facts_it_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))
    facts = tmp_path / "cache" / "scan-facts"
    plain = _scan(capsys, root, "--no-cache")
    assert not facts.exists()

    first = _scan(capsys, root)
    written = _entries(facts)
    assert len(written) >= 10  # one entry per source file of the fixture
    assert _scan(capsys, root) == first == plain
    assert _entries(facts) == written  # all read back: nothing parsed and written again

    gelu = root / "csrc" / "gelu.cu"
    gelu.write_text(gelu.read_text().replace("gelu_fwd_kernel", "gelu_forward_kernel"))
    changed = _scan(capsys, root)
    assert "gelu_forward_kernel" in changed and changed == _scan(capsys, root, "--no-cache")
    assert len(_entries(facts)) == len(written) + 1  # only the changed file was parsed


def test_a_later_scan_in_the_same_process_sees_files_added_since(tmp_path: Path) -> None:
    """Which files exist is asked once per scan, not once per process: a long-lived
    process (the Action, a test session) scans a tree again after it changed."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "scale.cu").write_text(KERNEL)
    (root / "pkg" / "ops.py").write_text(OPS)

    def sources() -> set[str]:
        report = scan(root, Config())
        return {s for k in report.kernels for b in k.builds for s in b.sources}

    assert sources() == {"scale.cu"}  # not next to ops.py: found at the root
    (root / "pkg" / "scale.cu").write_text(KERNEL)
    assert sources() == {"pkg/scale.cu"}
