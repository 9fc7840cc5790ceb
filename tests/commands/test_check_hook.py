"""The pre-commit hooks on real temporary git repositories: `kfbot check` (scan, nvcc's
front end, reference pairing against HEAD), `kfbot hook verify` where there is no GPU,
the shared logic in kfbot.scan.changes, and the hook manifest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest
import yaml
from identify.identify import tags_from_filename

from kfbot.cli import build_parser, main
from kfbot.commands.compile_check import (
    compile_result,
    excused,
    front_end_flags,
    nvcc_command,
    torch_include_dirs,
)
from kfbot.commands.hook import missing_gpu
from kfbot.config import Config
from kfbot.errors import KfbotError
from kfbot.evaluate.against_base import compare_with_base
from kfbot.scan.changes import (
    base_tree,
    base_worktree,
    broken_pairings,
    by_op,
    changed_kernels,
    changed_paths,
    given_paths,
    resolve_base,
)
from kfbot.scan.model import BuildRecipe
from kfbot.scan.scanner import scan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example"
HEADERS = ROOT / "fixtures" / "templated_headers"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")
SOFTMAX = "csrc/softmax.cu"


def _commit(root: Path, message: str = "initial") -> git.Repo:
    repo = git.Repo.init(root)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "Dev")
        cfg.set_value("user", "email", "dev@example.com")
    repo.git.add("-A")
    repo.index.commit(message)
    return repo


def _project(tmp_path: Path, fixture: Path = EXAMPLE) -> Path:
    root = tmp_path / "project"
    shutil.copytree(fixture, root)
    _commit(root)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _drop_softmax_test(root: Path) -> None:
    tests = root / "tests" / "test_ops.py"
    kept = re.sub(r'@pytest.mark.parametrize\("shape", \[\(4096.*?\n\n\n', "", tests.read_text(),
                  flags=re.S)
    assert "def test_softmax" not in kept
    tests.write_text(kept)


def _check(capsys: pytest.CaptureFixture[str], root: Path, *files: str) -> tuple[int, str]:
    words = [f if f.startswith("-") else str(root / f) for f in files]
    code = main(["check", "--repo", str(root), *words])
    out, err = capsys.readouterr()
    return code, out + err


def _commit_all(root: Path) -> None:
    repo = git.Repo(root)
    repo.git.add("-A")
    repo.index.commit("more")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan's facts cache in the test's folder, never the user's."""
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))


def _state(root: Path) -> tuple[str, ...]:
    repo = git.Repo(root)
    return (repo.git.status("--porcelain", "--untracked-files=all"), repo.head.commit.hexsha,
            repo.git.worktree("list", "--porcelain"), repo.git.stash("list"),
            *(p.read_text() for p in sorted((root / "csrc").iterdir())))


# --- kfbot check ------------------------------------------------------------------------------


def test_nothing_changed_is_ok(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    code, out = _check(capsys, root)
    assert (code, out.strip()) == (0, "kfbot check: no kernel sources changed")


def test_a_changed_kernel_is_named_and_compile_checked(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    before = _state(root)
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "1 kernel touched by the 1 changed file" in out
    assert "softmax_kernel (csrc/softmax.cu:8; 1 reference test; changed: csrc/softmax.cu)" in out
    assert "matmul_kernel" not in out  # only linked into the same module
    if NVCC is not None:
        assert re.search(r"^csrc/softmax.cu: compiles \(nvcc front end, [\d.]+ s\)$", out, re.M)
    assert _state(root) == before  # the working tree, index, stash and worktrees as they were


def test_without_file_arguments_the_changes_since_head_are_checked(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "csrc" / "vector_add.cu").write_text((root / "csrc" / "vector_add.cu").read_text()
                                                 + "// note\n")
    code, out = _check(capsys, root)
    assert code == 0, out
    assert "saxpy_kernel (csrc/vector_add.cu:7" in out and "softmax_kernel" not in out


@needs_nvcc
def test_a_syntax_error_fails_with_file_and_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 0.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1
    assert 'csrc/softmax.cu:16: error: expected a ";"' in out.splitlines()


@needs_nvcc
def test_a_broken_header_fails_through_the_files_that_include_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path, HEADERS)
    header = root / "include" / "scale.cuh"
    _edit(header, "y[i] = alpha * x[i]", "y[i] = alpha * x[i] +")
    code, out = _check(capsys, root, "include/scale.cuh")
    assert code == 1, out
    assert "fwd::scale_kernel (include/scale.cuh:13" in out
    assert "bwd::scale_kernel" in out  # both kernels live in the header
    assert re.search(r"^include/scale.cuh:\d+: error: ", out, re.M), out


@needs_nvcc
def test_the_builds_include_folders_are_used(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    root = _project(tmp_path, HEADERS)  # scale_forward.cu finds scale.cuh through -Iinclude
    (root / "csrc" / "scale_forward.cu").write_text(
        (root / "csrc" / "scale_forward.cu").read_text() + "// touched\n")
    code, out = _check(capsys, root, "csrc/scale_forward.cu")
    assert code == 0, out
    assert "csrc/scale_forward.cu: compiles" in out


EXTRA = ("#include <torch/extension.h>\n__global__ void extra_kernel(float* x) { x[0] = 1; }\n"
         "void extra(torch::Tensor t) { extra_kernel<<<1, 1>>>(t.data_ptr<float>()); }\n")
TORCH_SKIP = ("kfbot check: nvcc skipped csrc/extra.cu: PyTorch's headers (torch/extension.h) "
              "take about 45 s to parse; `kfbot hook verify` builds what includes them; "
              "tree-sitter checked the syntax instead")


@needs_nvcc
def test_a_file_that_needs_torch_headers_is_left_to_tree_sitter(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(EXTRA)
    started = time.monotonic()
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    assert out.splitlines().count(TORCH_SKIP) == 1  # the reason, once
    assert time.monotonic() - started < 20  # it was not parsed with torch's headers


@needs_nvcc
def test_a_syntax_error_where_nvcc_cannot_look_fails_with_file_and_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(EXTRA)
    _commit_all(root)
    _edit(root / "csrc" / "extra.cu", "x[0] = 1;", "x[0] = 1")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 1, out
    lines = out.splitlines()
    assert "csrc/extra.cu:2: error: missing `;` (found by tree-sitter)" in lines
    assert TORCH_SKIP + ", and found the errors above" in lines


def _without_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(shutil.which("git") or "git", bare / "git")
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)


def test_without_nvcc_tree_sitter_checks_the_syntax(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    _edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: nvcc not found (set CUDA_HOME or put it on PATH): tree-sitter " \
           "checked the syntax instead" in out.splitlines()
    _edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 0.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out
    assert "csrc/softmax.cu:15: error: missing `;` (found by tree-sitter)" in out.splitlines()


def test_what_tree_sitter_cannot_parse_already_is_not_blamed_on_the_change(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    # A line the grammar cannot parse, committed long ago.
    _edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 128\nint legacy = ) 1;")
    _commit_all(root)
    _edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 1.0f;")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    _edit(root / SOFTMAX, "float sum = 1.0f;", "float sum = 1.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out
    errors = [line for line in out.splitlines() if ": error: " in line]
    assert errors == ["csrc/softmax.cu:16: error: missing `;` (found by tree-sitter)"]


# Valid CUDA (nvcc with --extended-lambda) that tree-sitter's grammar cannot read, in a
# file nvcc skips for its torch headers: what a commit hook must not block.
BLIND = EXTRA + ("void each(float* x, int n) {\n"
                 "  auto twice = [=] __device__ (int i) { x[i] = 2 * x[i]; };\n"
                 "  (void)twice;\n"
                 "}\n")
BLIND_NOTE = ("csrc/extra.cu: note: not checked: tree-sitter cannot read changed line 5, which "
              "it could not read before the change either; nvcc did not look (")


def test_a_valid_edit_of_a_line_tree_sitter_cannot_read_passes_with_a_note(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(BLIND)
    _commit_all(root)
    _edit(root / "csrc" / "extra.cu", "x[i] = 2 * x[i];", "x[i] = (2 * x[i]);")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    (note,) = [line for line in out.splitlines() if ": note: " in line]
    assert note.startswith(BLIND_NOTE), note
    assert ("PyTorch's headers (torch/extension.h)" if NVCC else "nvcc not found") in note
    assert ": error: " not in out
    # A comment beside it touches nothing tree-sitter reads: not even a note.
    _edit(root / "csrc" / "extra.cu", "  (void)twice;", "  // keep it\n  (void)twice;")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    # A missing `;` in a place that parsed before is the change's, blind spots or not.
    _edit(root / "csrc" / "extra.cu", "x[0] = 1;", "x[0] = 1")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 1, out
    errors = [line for line in out.splitlines() if ": error: " in line]
    assert errors == ["csrc/extra.cu:2: error: missing `;` (found by tree-sitter)"]
    assert "`SKIP=kfbot-check git commit` skips the hook once" in out


def test_a_new_file_fails_only_on_a_missing_token(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(BLIND)
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    (note,) = [line for line in out.splitlines() if ": note: " in line]
    assert note.startswith("csrc/extra.cu: note: not checked: tree-sitter cannot read line 5 "
                           "of this new file; nvcc did not look ("), note
    (root / "csrc" / "extra.cu").write_text(BLIND.replace("(void)twice;", "(void)twice"))
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 1, out
    assert "csrc/extra.cu:6: error: missing `;` (found by tree-sitter)" in out.splitlines()


def test_a_file_nothing_can_read_is_named_with_the_reason(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    soup = root / "csrc" / "soup.cu"  # macro soup: no grammar reads it
    soup.write_text("#define GO(T, ...) __VA_ARGS__\nvoid f() { GO(float, { int a = 1; }); }\n")
    _commit_all(root)
    _edit(soup, "int a = 1;", "int a = 2;")
    code, out = _check(capsys, root, "csrc/soup.cu")
    assert code == 0, out
    assert "csrc/soup.cu: note: not checked: tree-sitter cannot read changed line 2, which it " \
           "could not read before the change either; nvcc did not look (nvcc not found (set " \
           "CUDA_HOME or put it on PATH))" in out.splitlines()
    assert out.splitlines()[-1] == "kfbot check: nvcc not found (set CUDA_HOME or put it on " \
        "PATH): tree-sitter checked the syntax instead, but for what is noted above"


SOUP_TORCH = EXTRA + "#define GO(T, ...) __VA_ARGS__\nvoid f() { GO(float, { int a = 1; }); }\n"


@pytest.mark.gpu  # needs no GPU, but torch's headers: about 45 s, for the GPU machine's cores
@needs_nvcc
def test_with_torch_the_compiler_settles_what_tree_sitter_cannot_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if torch_include_dirs() is None:
        pytest.skip("torch's headers are not installed for this Python")
    root = _project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(SOUP_TORCH)  # valid, and new: a note at most
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0 and "csrc/extra.cu: note: not checked: tree-sitter cannot read" in out
    code, out = _check(capsys, root, "--with-torch", "csrc/extra.cu")
    assert code == 0, out
    assert re.search(r"^csrc/extra.cu: compiles \(nvcc with PyTorch's headers, [\d.]+ s\)$",
                     out, re.M), out
    assert ": note: " not in out and "nvcc skipped" not in out


@needs_nvcc
def test_an_nvcc_failure_that_names_no_line_does_not_block(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "99.0")  # no nvcc knows sm_990
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: nvcc skipped csrc/softmax.cu: nvcc stopped without naming a line " \
           "(exit 1: Unsupported gpu architecture 'sm_990'); tree-sitter checked the syntax " \
           "instead" in out.splitlines()
    _edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 0.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out  # tree-sitter still catches what the change broke


@needs_nvcc
def test_a_library_missing_here_and_before_does_not_block(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "#include <cstdint>", "#include <cstdint>\n#include <cutlass/cutlass.h>")
    _commit_all(root)
    _edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: nvcc skipped csrc/softmax.cu: nvcc cannot find cutlass/cutlass.h here, " \
           "which the committed version includes too; tree-sitter checked the syntax " \
           "instead" in out.splitlines()
    _edit(root / SOFTMAX, "#include <cstdint>", "#include <cstdint>\n#include \"nowhere.cuh\"")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out  # the change's own include names nothing
    assert "nowhere.cuh" in out


def test_a_staged_deletion_of_a_reference_test_fails(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    root = _project(tmp_path)
    repo = git.Repo(root)
    repo.index.remove(["tests/test_ops.py"], working_tree=True)
    # An unrelated staged edit beside it: the hook must look past it to the deletion.
    _edit(root / "csrc" / "bindings.cpp", "#include", "// the bindings\n#include")
    repo.index.add(["csrc/bindings.cpp"])
    (root / "notes.py").write_text("x = 1\n")  # untracked: not part of the commit
    code, out = _check(capsys, root, "--staged")
    assert code == 1, out
    broken = [line for line in out.splitlines() if "no reference test reaches it" in line]
    assert [b.split(":")[2].strip() for b in broken] == \
        ["matmul_kernel", "softmax_kernel", "saxpy_kernel"]
    assert "(at HEAD: tests/test_ops.py:13 test_softmax)" in broken[1]


def test_staged_sees_only_what_is_staged(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    root = _project(tmp_path)
    code, out = _check(capsys, root, "--staged", SOFTMAX)
    assert code == 2 and "--staged checks what is staged: give it no FILES" in out
    _drop_softmax_test(root)  # not staged: not part of the next commit
    code, out = _check(capsys, root, "--staged")
    assert (code, out.strip()) == (0, "kfbot check: no kernel sources changed")
    git.Repo(root).git.add("tests/test_ops.py")
    code, out = _check(capsys, root, "--staged")
    assert code == 1 and "softmax_kernel: no reference test reaches it any more" in out


def test_the_base_is_scanned_only_when_a_pairing_may_change(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    tests = root / "tests" / "test_ops.py"
    # A skip reason: nothing the scan reads (tolerances it does read).
    _edit(tests, 'reason="needs a CUDA GPU"', 'reason="needs an NVIDIA GPU"')
    _edit(root / SOFTMAX, "float sum = 0.0f;", "// the sum\n    float sum = 0.0f;")
    code, out = _check(capsys, root, "-v", SOFTMAX, "tests/test_ops.py")
    assert code == 0, out
    assert "the base is not scanned: no changed file can change a pairing" in out
    _drop_softmax_test(root)
    code, out = _check(capsys, root, "-v", "tests/test_ops.py")
    assert code == 1, out
    assert "the base is scanned: what the scan reads from tests/test_ops.py changed" in out
    assert "softmax_kernel: no reference test reaches it any more" in out


def test_a_removed_reference_test_fails_naming_the_kernel(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    root = _project(tmp_path)
    _drop_softmax_test(root)
    code, out = _check(capsys, root, "tests/test_ops.py")
    assert code == 1
    assert "csrc/softmax.cu:8: softmax_kernel: no reference test reaches it any more " \
           "(at HEAD: tests/test_ops.py:13 test_softmax)" in out.splitlines()
    assert "matmul_kernel: no reference" not in out


def test_a_deleted_test_file_breaks_every_pairing_it_held(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "tests" / "test_ops.py").unlink()
    code, out = _check(capsys, root)
    assert code == 1
    broken = [line for line in out.splitlines() if "no reference test reaches it" in line]
    assert [b.split(":")[2].strip() for b in broken] == \
        ["matmul_kernel", "softmax_kernel", "saxpy_kernel"]


def test_a_removed_binding_breaks_the_pairing_too(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / "csrc" / "bindings.cpp",
          '    m.def("saxpy", &saxpy, "a * x + b for a scalar a");\n', "")
    code, out = _check(capsys, root, "csrc/bindings.cpp")
    assert code == 1
    assert "csrc/vector_add.cu:7: saxpy_kernel: no reference test reaches it any more" in out


def test_a_non_kernel_file_is_ok_and_quick(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "README.md").write_text("edited\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kfbot", "check", "README.md"], cwd=root,
                          capture_output=True, text=True, check=False)
    assert time.monotonic() - started < 5
    assert (proc.returncode, proc.stdout.strip()) == (0, "kfbot check: no kernel sources changed")


def test_the_light_hook_never_imports_torch(tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    _drop_softmax_test(root)
    code = ("import sys\nfrom kfbot.cli import main\n"
            "rc = main(['check', 'csrc/softmax.cu', 'tests/test_ops.py'])\n"
            "print('torch' in sys.modules, rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, check=False)
    assert proc.stdout.strip().splitlines()[-1] == "False 1", proc.stdout + proc.stderr


def test_outside_a_git_repository_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    root = tmp_path / "plain"
    shutil.copytree(EXAMPLE, root)
    code, out = _check(capsys, root)
    assert code == 2
    assert out.strip() == f"kfbot: error: {root}: not inside a git repository"


def test_an_unknown_base_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    root = _project(tmp_path)
    code = main(["check", "--repo", str(root), "--base", "no-such-branch"])
    assert code == 2
    assert "no-such-branch: not a commit" in capsys.readouterr().err


def test_a_repository_without_commits_checks_but_cannot_compare(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    shutil.copytree(EXAMPLE, root)
    git.Repo.init(root)
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: HEAD has no commit yet: reference pairing not compared" in out


def test_a_project_in_a_subfolder(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    top = tmp_path / "top"
    shutil.copytree(EXAMPLE, top / "proj")
    (top / "README.md").write_text("top\n")
    _commit(top)
    _drop_softmax_test(top / "proj")
    monkeypatch.chdir(top)  # pre-commit runs hooks from the top, with top-relative names
    code = main(["check", "--repo", "proj", "proj/tests/test_ops.py", "README.md"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "csrc/softmax.cu:8: softmax_kernel: no reference test reaches it any more" in out


# --- kfbot.scan.changes -----------------------------------------------------------------------


def test_changed_paths_cover_staged_unstaged_untracked_and_deleted(tmp_path: Path) -> None:
    root = _project(tmp_path)
    repo = git.Repo(root)
    (root / "csrc" / "new.cu").write_text("__global__ void n() {}\n")
    _edit(root / SOFTMAX, "BLOCK 128", "BLOCK 64")
    repo.index.add([SOFTMAX])
    (root / "csrc" / "matmul.cu").write_text("// gone\n")
    (root / "csrc" / "vector_add.cu").unlink()
    (root / "build").mkdir()
    (root / ".gitignore").write_text("build/\n")
    (root / "build" / "ignored.cu").write_text("")
    assert changed_paths(root) == [".gitignore", "csrc/matmul.cu", "csrc/new.cu",
                                   "csrc/softmax.cu", "csrc/vector_add.cu"]


def test_changed_kernels_follow_headers_bindings_and_launchers(tmp_path: Path) -> None:
    root = _project(tmp_path, HEADERS)
    report = scan(root, Config())
    by_header = changed_kernels(root, "HEAD", ["include/scale.cuh"], report)
    assert sorted(c.kernel.id for c in by_header) == [
        "include/scale.cuh::bwd::scale_kernel", "include/scale.cuh::fwd::scale_kernel"]
    by_launcher = changed_kernels(root, "HEAD", ["csrc/scale_backward.cu"], report)
    assert [(c.kernel.id, c.files) for c in by_launcher] == [
        ("include/scale.cuh::bwd::scale_kernel", ("csrc/scale_backward.cu",))]
    assert changed_kernels(root, "HEAD", ["tests/test_scale.py", "README.md"], report) == []
    assert len(changed_kernels(root, "HEAD", ["csrc/scale.cpp"], report)) == 2  # bindings


def test_kernels_of_one_op_are_verified_together(tmp_path: Path) -> None:
    root = _project(tmp_path)
    faster = ROOT / "tests" / "data" / "candidates" / "softmax_block_per_row" / SOFTMAX
    shutil.copyfile(faster, root / SOFTMAX)  # adds softmax_short_rows beside softmax_kernel
    _edit(root / "csrc" / "matmul.cu", "#define TILE 16", "#define TILE 32")
    groups = by_op(changed_kernels(root))
    assert [[c.kernel.name for c in g] for g in groups] == [
        ["matmul_kernel"], ["softmax_kernel", "softmax_short_rows"]]


def test_the_base_is_read_without_touching_the_working_tree(tmp_path: Path) -> None:
    root = _project(tmp_path)
    repo = git.Repo(root)
    _edit(root / SOFTMAX, "BLOCK 128", "BLOCK 64")
    (root / "notes.txt").write_text("mine\n")
    sha = resolve_base(root, "HEAD")
    assert sha == repo.head.commit.hexsha
    before = _state(root)
    with base_tree(root, sha) as tree:
        assert "#define BLOCK 128" in (tree / SOFTMAX).read_text()
        assert not (tree / "README.md").exists()  # only what the scan reads
    with base_worktree(root, sha) as tree:
        assert "#define BLOCK 128" in (tree / SOFTMAX).read_text()
        assert (tree / "README.md").exists()
        assert len(repo.git.worktree("list").splitlines()) == 2
    assert not tree.exists()
    assert _state(root) == before


def test_broken_pairings_against_an_older_base(tmp_path: Path) -> None:
    root = _project(tmp_path)
    repo = git.Repo(root)
    _drop_softmax_test(root)
    repo.git.add("-A")
    repo.index.commit("drop the softmax test")
    report = scan(root, Config())
    assert broken_pairings(root, "HEAD", report) == []
    (broken,) = broken_pairings(root, "HEAD~1", report)
    assert broken.kernel.id == "csrc/softmax.cu::softmax_kernel"
    assert [(r.file, r.test) for r in broken.had] == [("tests/test_ops.py", "test_softmax")]


def test_given_paths_are_made_relative_to_the_root(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj" / "csrc").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert given_paths(tmp_path / "proj", [Path("proj/csrc/a.cu"), Path("README.md"),
                                           tmp_path / "proj" / "b.py"]) == ["csrc/a.cu", "b.py"]


def test_resolve_base_outside_git_says_so(tmp_path: Path) -> None:
    with pytest.raises(KfbotError, match="not inside a git repository"):
        resolve_base(tmp_path, "HEAD")


# --- the nvcc command and its output, without nvcc --------------------------------------------


def test_the_front_end_command_takes_the_builds_parse_flags() -> None:
    recipe = BuildRecipe(kind="load", name="ext", file="ops.py", line=3,
                         sources=("csrc/a.cu",), defines=(("BLOCK", "256"), ("FAST", "")),
                         extra_cuda_cflags=("-O3", "-gencode", "arch=compute_80,code=sm_80",
                                            "--use_fast_math", "-std=c++20", "-Xptxas", "-v"),
                         include_dirs=("include",))
    command = nvcc_command("nvcc", "csrc/a.cu", recipe)
    assert command[:3] == ["nvcc", "-cubin", "-fdevice-syntax-only"]
    assert command[-3:] == ["-o", os.devnull, "./csrc/a.cu"]  # never read as an option
    flags = command[3:-3]
    assert {"-Iinclude", "-DBLOCK=256", "-DFAST", "--use_fast_math", "-std=c++20",
            "--expt-relaxed-constexpr"} <= set(flags)
    assert "-std=c++17" not in flags and "-O3" not in flags and "-gencode" not in flags
    assert front_end_flags(["-I", "inc", "-rdc=true", "-include", "pre.h"]) == \
        ["-I", "inc", "-include", "pre.h"]


def test_compile_output_is_read_into_file_and_line() -> None:
    output = ('csrc/a.cu(16): error: expected a ";"\n      for (;;) x;\n      ^\n\n'
              '1 error detected in the compilation of "csrc/a.cu".\n')
    result = compile_result("csrc/a.cu", 1, output, 0.3)
    assert [(d.file, d.line, d.message) for d in result.errors] == \
        [("csrc/a.cu", 16, 'expected a ";"')]
    torch = compile_result("csrc/b.cu", 1, "csrc/b.cu:1:10: fatal error: ATen/ATen.h: No such "
                           "file or directory\ncompilation terminated.\n", 0.1)
    assert (torch.errors, torch.skipped is not None) == ((), True)
    assert "ATen/ATen.h" in (torch.skipped or "")
    # A failure that names no line is no evidence against the change: not checked.
    silent = compile_result("csrc/c.cu", 2, "", 0.1)
    assert (silent.errors, silent.skipped) == \
        ((), "nvcc stopped without naming a line (exit 2: no message)")
    fatal = compile_result("csrc/c.cu", 1, "nvcc fatal   : Unsupported gpu architecture "
                           "'sm_990'\n", 0.1)
    assert (fatal.errors, fatal.skipped) == ((), "nvcc stopped without naming a line (exit 1: "
                                             "Unsupported gpu architecture 'sm_990')")


def test_a_header_the_committed_version_could_not_find_either_is_excused() -> None:
    output = ("csrc/a.cu:2:10: fatal error: cutlass/cutlass.h: No such file or directory\n"
              "compilation terminated.\n")
    result = compile_result("csrc/a.cu", 1, output, 0.1)
    assert result.missing_header == "cutlass/cutlass.h" and result.errors
    old = b"#include <cuda.h>\n#include <cutlass/cutlass.h>\n"
    (kept,) = excused([result], {"csrc/a.cu": old})
    assert (kept.errors, kept.skipped) == ((), "nvcc cannot find cutlass/cutlass.h here, which "
                                           "the committed version includes too")
    # The change wrote the include (or the file is new): its error stands.
    assert excused([result], {"csrc/a.cu": b"#include <cuda.h>\n"}) == [result]
    assert excused([result], {"csrc/a.cu": None}) == [result]


def test_torch_headers_are_found_without_importing_torch() -> None:
    code = ("import sys\nfrom kfbot.commands.compile_check import torch_include_dirs\n"
            "print(torch_include_dirs() is not None, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    found, imported = done.stdout.split()
    assert imported == "False"
    dirs = torch_include_dirs()
    if found == "True":
        assert dirs is not None and (Path(dirs[0]) / "torch" / "extension.h").is_file()
        command = nvcc_command("nvcc", "csrc/a.cu", None, dirs)
        assert f"-I{dirs[0]}" in command and "-DTORCH_API_INCLUDE_EXTENSION_H" in command
    else:
        assert dirs is None


# --- kfbot hook verify without a GPU ----------------------------------------------------------

no_gpu = pytest.mark.skipif(missing_gpu() is None, reason="this machine can run kernels")


@no_gpu
def test_the_gpu_hook_skips_without_a_gpu(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "BLOCK 128", "BLOCK 256")
    code = main(["hook", "verify", "--repo", str(root), str(root / SOFTMAX)])
    out = capsys.readouterr().out
    assert code == 0
    assert re.fullmatch(r"kfbot hook verify: skipped \(.+\); not verified: softmax_kernel\n", out)
    code = main(["hook", "verify", "--repo", str(root), "--require-gpu", str(root / SOFTMAX)])
    assert code == 3
    assert capsys.readouterr().err.startswith("kfbot: error: cannot verify softmax_kernel: ")


@no_gpu
def test_comparing_with_the_base_without_a_gpu_says_so_and_cleans_up(tmp_path: Path) -> None:
    root = _project(tmp_path)
    _edit(root / SOFTMAX, "BLOCK 128", "BLOCK 256")
    before = _state(root)
    (changed,) = changed_kernels(root)
    with pytest.raises(KfbotError) as raised:
        compare_with_base(root, "HEAD", changed, gpu=None, cache_dir=tmp_path / "cache")
    assert raised.value.exit_code == 3
    assert _state(root) == before  # the temporary worktree is gone again


def test_the_gpu_hook_has_nothing_to_do_without_changed_kernels(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = _project(tmp_path)
    _drop_softmax_test(root)
    assert main(["hook", "verify", "--repo", str(root), "--require-gpu"]) == 0
    assert capsys.readouterr().out == "kfbot hook verify: no kernel changed: nothing to verify\n"


@no_gpu
def test_at_pre_push_the_gpu_hook_compares_with_the_remotes_commit(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    repo = git.Repo(root)
    _edit(root / "csrc" / "matmul.cu", "#define TILE 16", "#define TILE 32")
    repo.git.add("-A")
    repo.index.commit("bigger tiles")
    monkeypatch.setenv("PRE_COMMIT_FROM_REF", repo.commit("HEAD~1").hexsha)
    assert main(["hook", "verify", "--repo", str(root)]) == 0
    assert capsys.readouterr().out.endswith("not verified: matmul_kernel\n")


def test_hook_needs_the_hook_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["hook"])
    assert exited.value.code == 2
    assert "verify" in capsys.readouterr().err


# --- the hook manifest ------------------------------------------------------------------------


def test_the_pre_commit_manifest() -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"kfbot-check", "kfbot-verify"}
    light, gpu = hooks["kfbot-check"], hooks["kfbot-verify"]
    assert (light["entry"], light["language"]) == ("kfbot check --staged", "python")
    assert "stages" not in light  # every stage the user installs, pre-commit first
    # Runs on every commit and reads the staged change itself: deletions included.
    assert (light["always_run"], light["pass_filenames"]) == (True, False)
    assert "verbose" not in light  # silent when it passes
    assert (gpu["entry"], gpu["language"]) == ("kfbot hook verify", "system")
    assert gpu["stages"] == ["manual", "pre-push"]
    assert gpu["pass_filenames"] is True and gpu["verbose"] is True  # slower: a warning
    for name in ("csrc/a.cu", "inc/a.cuh", "b.cpp", "x/y.h", "z.hpp", "w.inl", "c.c",
                 "tests/t.py", "kfbot.yaml", ".github/kfbot.yml", ".kfbot.yaml"):
        assert tags_from_filename(name) & set(gpu["types_or"]), name
    for name in ("README.md", "data.json", "notes.txt", "a.cu.orig"):
        assert not tags_from_filename(name) & set(gpu["types_or"]), name
    for hook in hooks.values():
        assert hook["name"] == hook["id"]  # pre-commit's status lines stay short
        assert hook["require_serial"] is True
        assert set(hook) <= {"id", "name", "description", "entry", "language", "types_or",
                             "pass_filenames", "require_serial", "stages", "verbose",
                             "always_run", "minimum_pre_commit_version"}
    args = build_parser().parse_args(light["entry"].split()[1:])
    assert callable(args.run) and args.staged and args.files == []
    args = build_parser().parse_args([*gpu["entry"].split()[1:], "a.cu", "b.py"])
    assert callable(args.run) and [str(f) for f in args.files] == ["a.cu", "b.py"]
