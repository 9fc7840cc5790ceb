"""What `kfbot scan` ends with: the counts a person acts on (found, bound, built, with a
reference, ready to optimise), the most common reason for the rest with the kfbot.yaml
that fixes it, and what tree-sitter did not understand, counted; references as the
expression they compare, confidence in words; and `--explain` fitted to the terminal."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kfbot.cli import main
from kfbot.config import Config, load_config
from kfbot.scan.scanner import scan
from kfbot.scan.show.summary import NO_REFERENCE, NOT_BOUND, NOT_BUILT, readiness, summary_lines

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
LONELY = """\
__global__ void lonely_kernel(float* x) { x[0] = 1.0f; }
void run_lonely(float* x) { lonely_kernel<<<1, 1>>>(x); }
"""
ORPHANS = """\
#include <torch/extension.h>
__global__ void orphan_a_kernel(float* x) { x[0] = 1.0f; }
__global__ void orphan_b_kernel(float* x) { x[0] = 2.0f; }
void orphan_a(torch::Tensor x) { orphan_a_kernel<<<1, 1>>>(x.data_ptr<float>()); }
void orphan_b(torch::Tensor x) { orphan_b_kernel<<<1, 1>>>(x.data_ptr<float>()); }
PYBIND11_MODULE(orphan_ext, m) { m.def("orphan_a", &orphan_a); m.def("orphan_b", &orphan_b); }
"""
SOUP = "#define GO(T, ...) __VA_ARGS__\nvoid f() { GO(float, { int a = 1; }); }\n"
SOFTMAX_TEST = """
def test_softmax_{n}():
    x = torch.randn(8, {n}, device="cuda")
    torch.testing.assert_close(kernels_demo.softmax(x), torch.softmax(x, dim=-1))
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """fixtures/example, and: a kernel no binding reaches, two bound kernels no build
    compiles, saxpy's test gone, five more softmax tests, a file of macro soup."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "example", root)
    (root / "csrc" / "lonely.cu").write_text(LONELY)
    (root / "csrc" / "orphans.cu").write_text(ORPHANS)
    (root / "csrc" / "soup.cu").write_text(SOUP)
    tests = root / "tests" / "test_ops.py"
    text = tests.read_text()
    tests.write_text(text[:text.index('@pytest.mark.parametrize("shape", [(1 << 20,)')])
    (root / "tests" / "test_more.py").write_text(
        "import torch\n\nimport kernels_demo\n"
        + "".join(SOFTMAX_TEST.format(n=n) for n in range(1, 6)))
    return root


def test_the_counts_and_the_most_common_reason(repository: Path) -> None:
    report = scan(repository, Config())
    r = readiness(report.kernels)
    assert (r.found, r.bound, r.built, r.referenced, r.ready) == (6, 5, 3, 2, 2)
    assert [(why, sorted(k.name for k in ks)) for why, ks in r.reasons] == [
        (NOT_BUILT, ["orphan_a_kernel", "orphan_b_kernel"]),
        (NOT_BOUND, ["lonely_kernel"]), (NO_REFERENCE, ["saxpy_kernel"])]
    lines = summary_lines(report)
    assert lines[0] == ("6 kernels found: 5 bound to Python, 3 built, 2 with a reference test; "
                        "2 ready to optimise.")
    assert lines[1] == ("Of the other 4, 2 have no build recipe kfbot can read. A task in "
                        "kfbot.yaml that says how to build each fixes it, e.g.:")
    snippet = "\n".join(line[2:] for line in lines if line.startswith("  "))
    assert lines[-2] == "Then: 1 is not bound to Python; 1 has no reference test."
    assert lines[-1] == ("tree-sitter did not understand 1 place in 1 file (code it cannot "
                         "read may still compile; the rest of each file was read): `kfbot "
                         "scan --json` lists them.")
    # The snippet is a valid config that names this repository's kernel and files.
    (repository / "kfbot.yaml").write_text("version: 1\n" + snippet + "\n")
    task = load_config(None, repository).tasks[0]
    assert task.kernel == "csrc/orphans.cu::orphan_a_kernel"
    assert task.build is not None and task.build.sources == ("csrc/orphans.cu",)
    assert task.build.name == "orphan_ext"
    fixed = readiness(scan(repository, load_config(None, repository)).kernels)
    assert (fixed.built, fixed.ready) == (4, 2)  # built now; a reference is still missing
    assert yaml.safe_load(snippet)["tasks"][0]["build"]["kind"] == "load"


def test_a_missing_reference_is_fixed_with_the_ops_real_name(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "example", root)
    (root / "tests" / "test_ops.py").unlink()
    lines = summary_lines(scan(root, Config()))
    assert lines[1].startswith("All 3 have no reference test. A task in kfbot.yaml with the op")
    # The function kernels_demo/__init__.py wraps the loaded op in: importable, unlike
    # the extension load() builds at run time.
    assert '      op: "kernels_demo:matmul"  # the Python callable that runs it' in lines


def test_the_table_ends_with_the_summary_and_speaks_in_words(
        repository: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["scan", str(repository)]) == 0
    out = capsys.readouterr().out
    assert "syntax error" not in out and "vs None" not in out
    assert not re.search(r"\(\d\.\d+\)", out)  # no bare confidence numbers
    assert "kernels_demo.softmax vs torch.softmax(x, dim=-1) (sure)" in " ".join(out.split())
    said = " ".join(out.split())
    assert said.endswith("Then: 1 is not bound to Python; 1 has no reference test. tree-sitter "
                         "did not understand 1 place in 1 file (code it cannot read may still "
                         "compile; the rest of each file was read): `kfbot scan --json` lists "
                         "them.")
    markdown = subprocess.run([sys.executable, "-m", "kfbot", "scan", str(repository),
                               "--format", "markdown"], capture_output=True, text=True,
                              check=True).stdout
    assert "6 kernels found: 5 bound to Python, 3 built, 2 with a reference test; 2 ready " \
           "to optimise." in markdown
    assert "did not understand" not in markdown.partition("## Problems")[2]  # counted once


def _explain(root: Path, kernel: str, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run([sys.executable, "-m", "kfbot", "scan", str(root), "--explain",
                           kernel], capture_output=True, text=True, env=env, check=True)
    return done.stdout


def test_explain_fits_80_columns_and_collapses_alike_chains(repository: Path) -> None:
    for root, kernel in ((repository, "softmax_kernel"), (repository, "lonely_kernel"),
                         (FIXTURES / "pkg_chain", "gelu_bwd_kernel"),
                         (FIXTURES / "torch_ops_multi", "rowmax_naive_kernel")):
        out = _explain(root, kernel, 80)
        too_long = [line for line in out.splitlines() if len(line) > 80]
        assert not too_long, too_long
    out = _explain(repository, "softmax_kernel", 80)
    said = " ".join(out.split())
    # Six tests, one way down from the op: one chain, the other five named after it.
    assert said.count("reference ") == 1
    assert [line.split()[1] for line in out.splitlines() if line.startswith("  test ")] == \
        ["tests/test_more.py:7"]
    assert "reference 1 of 1: tests/test_more.py:7 test_softmax_1 (pytest; sure; a " \
           "mismatch raises)" in said
    assert "the same way down from the op: tests/test_more.py:11 test_softmax_2, " \
           "tests/test_more.py:15 test_softmax_3, tests/test_more.py:19 test_softmax_4 and 2 " \
           "more like it" in said
    wide = _explain(repository, "softmax_kernel", 300)
    assert max(map(len, wide.splitlines())) > 80  # wrapped for the narrow terminal only


def test_a_cpu_twins_test_is_not_a_cuda_kernels_reference(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "example", root)
    # A pure-PyTorch twin of the op under the same name, and a test of the twin alone.
    (root / "kernels_demo" / "cpu.py").write_text(
        "import torch\n\n\ndef softmax(x):\n    return torch.softmax(x.float(), dim=-1)\n")
    (root / "tests" / "test_cpu.py").write_text(
        "import torch\n\nfrom kernels_demo import cpu\n\n\ndef test_cpu_softmax():\n"
        "    x = torch.randn(4, 8)\n"
        "    torch.testing.assert_close(cpu.softmax(x), torch.softmax(x, dim=-1))\n")
    report = scan(root, Config())
    (softmax,) = [k for k in report.kernels if k.name == "softmax_kernel"]
    assert [(r.file, r.test) for r in softmax.references] == [("tests/test_ops.py",
                                                               "test_softmax")]
    assert any("tests/test_cpu.py" in u and "cpu.softmax" in u for u in report.unfollowed)
