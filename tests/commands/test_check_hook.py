"""The light pre-commit hook on real temporary git repositories: `kfbot check` (scan,
nvcc's front end, reference pairing against HEAD) and the shared logic in
kfbot.scan.changes. Its compile check's parts without nvcc: test_compile_check.py; the
GPU hook without a GPU and the hook manifest: test_hook_verify.py."""

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
from hook_projects import (
    EXAMPLE,
    ROOT,
    SOFTMAX,
    commit,
    commit_all,
    drop_softmax_test,
    edit,
    project,
    snapshot,
)

from kfbot.cli import main
from kfbot.commands.compile_check import (
    torch_include_dirs,
)
from kfbot.config import Config
from kfbot.errors import KfbotError
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
from kfbot.scan.scanner import scan

HEADERS = ROOT / "fixtures" / "templated_headers"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")


def _check(capsys: pytest.CaptureFixture[str], root: Path, *files: str) -> tuple[int, str]:
    words = [f if f.startswith("-") else str(root / f) for f in files]
    code = main(["check", "--repo", str(root), *words])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan's facts cache in the test's folder, never the user's."""
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))


# --- kfbot check ------------------------------------------------------------------------------


def test_nothing_changed_is_ok(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = project(tmp_path)
    code, out = _check(capsys, root)
    assert (code, out.strip()) == (0, "kfbot check: no kernel sources changed")


def test_a_changed_kernel_is_named_and_compile_checked(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    before = snapshot(root)
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "1 kernel touched by the 1 changed file" in out
    assert "softmax_kernel (csrc/softmax.cu:8; 1 reference test; changed: csrc/softmax.cu)" in out
    assert "matmul_kernel" not in out  # only linked into the same module
    if NVCC is not None:
        assert re.search(r"^csrc/softmax.cu: compiles \(nvcc front end, [\d.]+ s\)$", out, re.M)
    assert snapshot(root) == before  # the working tree, index, stash and worktrees as they were


def test_without_file_arguments_the_changes_since_head_are_checked(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "csrc" / "vector_add.cu").write_text((root / "csrc" / "vector_add.cu").read_text()
                                                 + "// note\n")
    code, out = _check(capsys, root)
    assert code == 0, out
    assert "saxpy_kernel (csrc/vector_add.cu:7" in out and "softmax_kernel" not in out


@needs_nvcc
def test_a_syntax_error_fails_with_file_and_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 0.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1
    assert 'csrc/softmax.cu:16: error: expected a ";"' in out.splitlines()


@needs_nvcc
def test_a_broken_header_fails_through_the_files_that_include_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = project(tmp_path, HEADERS)
    header = root / "include" / "scale.cuh"
    edit(header, "y[i] = alpha * x[i]", "y[i] = alpha * x[i] +")
    code, out = _check(capsys, root, "include/scale.cuh")
    assert code == 1, out
    assert "fwd::scale_kernel (include/scale.cuh:13" in out
    assert "bwd::scale_kernel" in out  # both kernels live in the header
    assert re.search(r"^include/scale.cuh:\d+: error: ", out, re.M), out


@needs_nvcc
def test_the_builds_include_folders_are_used(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    root = project(tmp_path, HEADERS)  # scale_forward.cu finds scale.cuh through -Iinclude
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
    root = project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(EXTRA)
    started = time.monotonic()
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    assert out.splitlines().count(TORCH_SKIP) == 1  # the reason, once
    assert time.monotonic() - started < 20  # it was not parsed with torch's headers


@needs_nvcc
def test_a_syntax_error_where_nvcc_cannot_look_fails_with_file_and_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(EXTRA)
    commit_all(root)
    edit(root / "csrc" / "extra.cu", "x[0] = 1;", "x[0] = 1")
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
    root = project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: nvcc not found (set CUDA_HOME or put it on PATH): tree-sitter " \
           "checked the syntax instead" in out.splitlines()
    edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 0.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out
    assert "csrc/softmax.cu:15: error: missing `;` (found by tree-sitter)" in out.splitlines()


def test_what_tree_sitter_cannot_parse_already_is_not_blamed_on_the_change(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    # A line the grammar cannot parse, committed long ago.
    edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 128\nint legacy = ) 1;")
    commit_all(root)
    edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 1.0f;")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    edit(root / SOFTMAX, "float sum = 1.0f;", "float sum = 1.0f")
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
    root = project(tmp_path)
    (root / "csrc" / "extra.cu").write_text(BLIND)
    commit_all(root)
    edit(root / "csrc" / "extra.cu", "x[i] = 2 * x[i];", "x[i] = (2 * x[i]);")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    (note,) = [line for line in out.splitlines() if ": note: " in line]
    assert note.startswith(BLIND_NOTE), note
    assert ("PyTorch's headers (torch/extension.h)" if NVCC else "nvcc not found") in note
    assert ": error: " not in out
    # A comment beside it touches nothing tree-sitter reads: not even a note.
    edit(root / "csrc" / "extra.cu", "  (void)twice;", "  // keep it\n  (void)twice;")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 0, out
    # A missing `;` in a place that parsed before is the change's, blind spots or not.
    edit(root / "csrc" / "extra.cu", "x[0] = 1;", "x[0] = 1")
    code, out = _check(capsys, root, "csrc/extra.cu")
    assert code == 1, out
    errors = [line for line in out.splitlines() if ": error: " in line]
    assert errors == ["csrc/extra.cu:2: error: missing `;` (found by tree-sitter)"]
    assert "`SKIP=kfbot-check git commit` skips the hook once" in out


def test_a_new_file_fails_only_on_a_missing_token(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    root = project(tmp_path)
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
    root = project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    soup = root / "csrc" / "soup.cu"  # macro soup: no grammar reads it
    soup.write_text("#define GO(T, ...) __VA_ARGS__\nvoid f() { GO(float, { int a = 1; }); }\n")
    commit_all(root)
    edit(soup, "int a = 1;", "int a = 2;")
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
    root = project(tmp_path)
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
    root = project(tmp_path)
    edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "99.0")  # no nvcc knows sm_990
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: nvcc skipped csrc/softmax.cu: nvcc stopped without naming a line " \
           "(exit 1: Unsupported gpu architecture 'sm_990'); tree-sitter checked the syntax " \
           "instead" in out.splitlines()
    edit(root / SOFTMAX, "float sum = 0.0f;", "float sum = 0.0f")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out  # tree-sitter still catches what the change broke


@needs_nvcc
def test_a_library_missing_here_and_before_does_not_block(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / SOFTMAX, "#include <cstdint>", "#include <cstdint>\n#include <cutlass/cutlass.h>")
    commit_all(root)
    edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 0, out
    assert "kfbot check: nvcc skipped csrc/softmax.cu: nvcc cannot find cutlass/cutlass.h here, " \
           "which the committed version includes too; tree-sitter checked the syntax " \
           "instead" in out.splitlines()
    edit(root / SOFTMAX, "#include <cstdint>", "#include <cstdint>\n#include \"nowhere.cuh\"")
    code, out = _check(capsys, root, SOFTMAX)
    assert code == 1, out  # the change's own include names nothing
    assert "nowhere.cuh" in out


def test_a_staged_deletion_of_a_reference_test_fails(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    root = project(tmp_path)
    repo = git.Repo(root)
    repo.index.remove(["tests/test_ops.py"], working_tree=True)
    # An unrelated staged edit beside it: the hook must look past it to the deletion.
    edit(root / "csrc" / "bindings.cpp", "#include", "// the bindings\n#include")
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
    root = project(tmp_path)
    code, out = _check(capsys, root, "--staged", SOFTMAX)
    assert code == 2 and "--staged checks what is staged: give it no FILES" in out
    drop_softmax_test(root)  # not staged: not part of the next commit
    code, out = _check(capsys, root, "--staged")
    assert (code, out.strip()) == (0, "kfbot check: no kernel sources changed")
    git.Repo(root).git.add("tests/test_ops.py")
    code, out = _check(capsys, root, "--staged")
    assert code == 1 and "softmax_kernel: no reference test reaches it any more" in out


def test_the_base_is_scanned_only_when_a_pairing_may_change(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path)
    _without_nvcc(tmp_path, monkeypatch)
    tests = root / "tests" / "test_ops.py"
    # A skip reason: nothing the scan reads (tolerances it does read).
    edit(tests, 'reason="needs a CUDA GPU"', 'reason="needs an NVIDIA GPU"')
    edit(root / SOFTMAX, "float sum = 0.0f;", "// the sum\n    float sum = 0.0f;")
    code, out = _check(capsys, root, "-v", SOFTMAX, "tests/test_ops.py")
    assert code == 0, out
    assert "the base is not scanned: no changed file can change a pairing" in out
    drop_softmax_test(root)
    code, out = _check(capsys, root, "-v", "tests/test_ops.py")
    assert code == 1, out
    assert "the base is scanned: what the scan reads from tests/test_ops.py changed" in out
    assert "softmax_kernel: no reference test reaches it any more" in out


def test_a_removed_reference_test_fails_naming_the_kernel(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    root = project(tmp_path)
    drop_softmax_test(root)
    code, out = _check(capsys, root, "tests/test_ops.py")
    assert code == 1
    assert "csrc/softmax.cu:8: softmax_kernel: no reference test reaches it any more " \
           "(at HEAD: tests/test_ops.py:13 test_softmax)" in out.splitlines()
    assert "matmul_kernel: no reference" not in out


def test_a_deleted_test_file_breaks_every_pairing_it_held(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "tests" / "test_ops.py").unlink()
    code, out = _check(capsys, root)
    assert code == 1
    broken = [line for line in out.splitlines() if "no reference test reaches it" in line]
    assert [b.split(":")[2].strip() for b in broken] == \
        ["matmul_kernel", "softmax_kernel", "saxpy_kernel"]


def test_a_removed_binding_breaks_the_pairing_too(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / "csrc" / "bindings.cpp",
          '    m.def("saxpy", &saxpy, "a * x + b for a scalar a");\n', "")
    code, out = _check(capsys, root, "csrc/bindings.cpp")
    assert code == 1
    assert "csrc/vector_add.cu:7: saxpy_kernel: no reference test reaches it any more" in out


def test_a_non_kernel_file_is_ok_and_quick(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "README.md").write_text("edited\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kfbot", "check", "README.md"], cwd=root,
                          capture_output=True, text=True, check=False)
    assert time.monotonic() - started < 5
    assert (proc.returncode, proc.stdout.strip()) == (0, "kfbot check: no kernel sources changed")


def test_the_light_hook_never_imports_torch(tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / SOFTMAX, "#define BLOCK 128", "#define BLOCK 256")
    drop_softmax_test(root)
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
    root = project(tmp_path)
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
    commit(top)
    drop_softmax_test(top / "proj")
    monkeypatch.chdir(top)  # pre-commit runs hooks from the top, with top-relative names
    code = main(["check", "--repo", "proj", "proj/tests/test_ops.py", "README.md"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "csrc/softmax.cu:8: softmax_kernel: no reference test reaches it any more" in out


# --- kfbot.scan.changes -----------------------------------------------------------------------


def test_changed_paths_cover_staged_unstaged_untracked_and_deleted(tmp_path: Path) -> None:
    root = project(tmp_path)
    repo = git.Repo(root)
    (root / "csrc" / "new.cu").write_text("__global__ void n() {}\n")
    edit(root / SOFTMAX, "BLOCK 128", "BLOCK 64")
    repo.index.add([SOFTMAX])
    (root / "csrc" / "matmul.cu").write_text("// gone\n")
    (root / "csrc" / "vector_add.cu").unlink()
    (root / "build").mkdir()
    (root / ".gitignore").write_text("build/\n")
    (root / "build" / "ignored.cu").write_text("")
    assert changed_paths(root) == [".gitignore", "csrc/matmul.cu", "csrc/new.cu",
                                   "csrc/softmax.cu", "csrc/vector_add.cu"]


def test_changed_kernels_follow_headers_bindings_and_launchers(tmp_path: Path) -> None:
    root = project(tmp_path, HEADERS)
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
    root = project(tmp_path)
    faster = ROOT / "tests" / "data" / "candidates" / "softmax_block_per_row" / SOFTMAX
    shutil.copyfile(faster, root / SOFTMAX)  # adds softmax_short_rows beside softmax_kernel
    edit(root / "csrc" / "matmul.cu", "#define TILE 16", "#define TILE 32")
    groups = by_op(changed_kernels(root))
    assert [[c.kernel.name for c in g] for g in groups] == [
        ["matmul_kernel"], ["softmax_kernel", "softmax_short_rows"]]


def test_the_base_is_read_without_touching_the_working_tree(tmp_path: Path) -> None:
    root = project(tmp_path)
    repo = git.Repo(root)
    edit(root / SOFTMAX, "BLOCK 128", "BLOCK 64")
    (root / "notes.txt").write_text("mine\n")
    sha = resolve_base(root, "HEAD")
    assert sha == repo.head.commit.hexsha
    before = snapshot(root)
    with base_tree(root, sha) as tree:
        assert "#define BLOCK 128" in (tree / SOFTMAX).read_text()
        assert not (tree / "README.md").exists()  # only what the scan reads
    with base_worktree(root, sha) as tree:
        assert "#define BLOCK 128" in (tree / SOFTMAX).read_text()
        assert (tree / "README.md").exists()
        assert len(repo.git.worktree("list").splitlines()) == 2
    assert not tree.exists()
    assert snapshot(root) == before


def test_broken_pairings_against_an_older_base(tmp_path: Path) -> None:
    root = project(tmp_path)
    repo = git.Repo(root)
    drop_softmax_test(root)
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
