"""The scan's facts cache: a cached scan is the scan, files read back are not parsed
again, and an answer that depended on which files exist is not reused once that
changed."""

from __future__ import annotations

import importlib.util
import pkgutil
import shutil
from pathlib import Path

import kfbot.scan
from kfbot.config import Config
from kfbot.scan.facts_cache import code_digest, digest_of_code
from kfbot.scan.scanner import scan

ROOT = Path(__file__).resolve().parents[2]
KERNEL = """\
__global__ void scale_kernel(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2; }
void scale(float* x, int n) { scale_kernel<<<1, 128>>>(x, n); }
"""
OPS = """\
from torch.utils.cpp_extension import load

ext = load(name="scale_ext", sources=["scale.cu"])
"""


def entries(cache: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}


def test_a_cached_scan_is_the_scan_and_reads_entries_back(tmp_path: Path) -> None:
    root = tmp_path / "example"
    shutil.copytree(ROOT / "fixtures" / "example", root)
    cache = tmp_path / "cache"
    plain = scan(root, Config())
    first = scan(root, Config(), cache=cache)
    written = entries(cache)
    assert first == plain
    assert len(written) == plain.files_scanned
    second = scan(root, Config(), cache=cache)
    assert second == plain
    assert entries(cache) == written  # every file read back, none parsed and written again
    softmax = root / "csrc" / "softmax.cu"
    softmax.write_text(softmax.read_text().replace("#define BLOCK 128", "#define BLOCK 256"))
    third = scan(root, Config(), cache=cache)
    assert third == scan(root, Config())
    assert len(entries(cache)) == len(written) + 1  # only the changed file was parsed


def test_facts_that_depended_on_a_missing_file_are_read_again(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "scale.cu").write_text(KERNEL)
    (root / "pkg" / "ops.py").write_text(OPS)
    cache = tmp_path / "cache"

    def sources(report_root: Path) -> set[str]:
        report = scan(report_root, Config(), cache=cache)
        return {s for k in report.kernels for b in k.builds for s in b.sources}

    assert sources(root) == {"scale.cu"}  # not next to ops.py: found at the root
    (root / "pkg" / "scale.cu").write_text(KERNEL)
    assert sources(root) == {"pkg/scale.cu"}
    assert scan(root, Config(), cache=cache) == scan(root, Config())


def test_an_unreadable_entry_is_a_miss(tmp_path: Path) -> None:
    root = tmp_path / "example"
    shutil.copytree(ROOT / "fixtures" / "example", root)
    cache = tmp_path / "cache"
    scan(root, Config(), cache=cache)
    for entry in entries(cache):
        entry.write_bytes(b"not a pickle")
    assert scan(root, Config(), cache=cache) == scan(root, Config())


def test_a_change_in_any_scan_module_changes_the_digest(tmp_path: Path) -> None:
    # The extractors live in sub-packages (scan/cuda/, scan/python/): an edit there must
    # not let a scan read back facts an older extractor wrote.
    scan_code = Path(kfbot.scan.__file__).parent
    copy = tmp_path / "scan"
    shutil.copytree(scan_code, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert digest_of_code(copy) == code_digest()
    walked = pkgutil.walk_packages(kfbot.scan.__path__, "kfbot.scan.")
    modules = ["kfbot.scan", *(m.name for m in walked)]
    assert "kfbot.scan.cuda.facts" in modules and "kfbot.scan.link.join" in modules
    seen = {code_digest()}
    for name in modules:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        path = copy / Path(spec.origin).relative_to(scan_code)
        path.write_bytes(path.read_bytes() + b"\n# changed\n")
        seen.add(digest_of_code(copy))
    assert len(seen) == len(modules) + 1, "a module whose change left the digest as it was"
