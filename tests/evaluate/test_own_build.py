"""The repository's own build in a scratch copy, and the library that holds a kernel.

The repository here builds itself the way CMake-driven or hand-written setup scripts
do: its `setup.py` runs nvcc on each `.cu` into a library of its own, next to the
package (`python setup.py build_ext --inplace`). Real nvcc, real setuptools, real
binutils; nothing is run on a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.evaluate.baseline.step_reports import own_build_step
from kfbot.evaluate.build.layouts.own import OwnBuild, OwnBuilder, own_recipe
from kfbot.evaluate.build.repository import own_original, registrations
from kfbot.evaluate.build.symbols import holders, library_symbols, parse_symbol
from kfbot.evaluate.observe.mutants import NoMutant
from kfbot.evaluate.observe.own_tree import own_mutant_tree, own_tree
from kfbot.evaluate.task import KernelTask, OpBinding
from kfbot.scan.model import BuildRecipe, KernelDef
from kfbot.scan.scanner import scan

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

SETUP = '''\
import os
import subprocess
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class Nvcc(build_ext):
    """Each extension is one .cu, linked into a library by nvcc itself."""

    def build_extension(self, ext):
        out = self.get_ext_fullpath(ext.name)
        if os.path.exists(out) and all(os.path.getmtime(s) < os.path.getmtime(out)
                                       for s in ext.sources + ext.depends):
            return
        os.makedirs(os.path.dirname(out), exist_ok=True)
        print("nvcc", ext.sources[0], flush=True)
        subprocess.check_call(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90",
                               *ext.sources, "-o", out])


names = [n[:-3] for n in sorted(os.listdir("csrc")) if n.endswith(".cu")]
setup(name="rowpkg", ext_modules=[Extension(f"rowpkg._{n}", [f"csrc/{n}.cu"],
                                            depends=["csrc/common.cuh"]) for n in names],
      cmdclass={"build_ext": Nvcc})
'''

COMMON = "#pragma once\n#define ROWS_BLOCK 128\n"

SCALE = '''\
#include "common.cuh"
namespace rowpkg {
namespace {
template <typename T>
__global__ void scale_kernel(T* x, int n) {
  int i = blockIdx.x * ROWS_BLOCK + threadIdx.x;
  if (i < n) x[i] *= 2;
}
}  // namespace
void scale(float* x, int n) { scale_kernel<float><<<(n + 127) / 128, 128>>>(x, n); }
}  // namespace rowpkg
'''

SHIFT = '''\
#include "common.cuh"
namespace rowpkg {
__global__ void shift_kernel(float* x, int n) {
  int i = blockIdx.x * ROWS_BLOCK + threadIdx.x;
  if (i < n) x[i] += 1;
}
void shift(float* x, int n) { shift_kernel<<<(n + 127) / 128, 128>>>(x, n); }
}  // namespace rowpkg
'''


def _repo(root: Path, setup: str = SETUP) -> Path:
    (root / "csrc").mkdir(parents=True)
    (root / "rowpkg").mkdir()
    (root / "setup.py").write_text(setup)
    (root / "rowpkg" / "__init__.py").write_text("")
    (root / "csrc" / "common.cuh").write_text(COMMON)
    (root / "csrc" / "scale.cu").write_text(SCALE)
    (root / "csrc" / "shift.cu").write_text(SHIFT)
    return root


SCALE_KERNEL = KernelDef(name="scale_kernel", namespace="rowpkg", file="csrc/scale.cu",
                         line=5)
SHIFT_KERNEL = KernelDef(name="shift_kernel", namespace="rowpkg", file="csrc/shift.cu",
                         line=3)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OwnBuilder]:
    root = _repo(tmp_path_factory.mktemp("repo"))
    beats: list[str] = []
    builder = OwnBuilder(tmp_path_factory.mktemp("cache"), timeout_s=300,
                         progress=beats.append, heartbeat_s=0.5)
    builder.original(root, own_recipe("setup.py"))
    assert beats and "building setup.py" in beats[0]  # said before the build started
    return root, builder


def test_the_build_runs_in_a_copy_and_finds_each_library(
        built: tuple[Path, OwnBuilder]) -> None:
    root, builder = built
    build = builder.original(root, own_recipe("setup.py"))
    assert build.ok, build.tail
    assert build.cached  # the second time: the same content is not built again
    assert [build.module_name(lib) for lib in build.libraries] == \
        ["rowpkg._scale", "rowpkg._shift"]
    assert not list(root.rglob("*.so"))  # the user's checkout is left as it was
    assert "built 2 libraries" in build.why


def test_the_kernel_is_found_by_its_symbols(built: tuple[Path, OwnBuilder]) -> None:
    root, builder = built
    build = builder.original(root, own_recipe("setup.py"))
    libraries = [build.original / lib for lib in build.libraries]
    found = holders(SCALE_KERNEL, libraries)
    assert [h.library.name.split(".")[0] for h in found] == ["_scale"]
    # An anonymous namespace and the template arguments do not hide it.
    assert ("float",) in {s.template_args for s in found[0].symbols}
    assert [h.library.name.split(".")[0] for h in holders(SHIFT_KERNEL, libraries)] == \
        ["_shift"]
    other = KernelDef(name="scale_kernel", namespace="elsewhere", file="x.cu", line=1)
    assert holders(other, libraries) == []  # the namespace must match too


def test_a_stripped_library_still_names_its_kernels(
        built: tuple[Path, OwnBuilder], tmp_path: Path) -> None:
    root, builder = built
    build = builder.original(root, own_recipe("setup.py"))
    stripped = tmp_path / "_scale.so"
    subprocess.run(["strip", "-o", str(stripped), str(build.original / build.libraries[0])],
                   check=True)
    names = {(s.qualified_name, s.source) for s in library_symbols(stripped)}
    assert ("rowpkg::scale_kernel", "registered name") in names
    assert [h.library for h in holders(SCALE_KERNEL, [stripped])] == [stripped]


def test_a_candidate_rebuilds_its_library_and_leaves_the_workshop_original(
        built: tuple[Path, OwnBuilder]) -> None:
    root, builder = built
    build = builder.original(root, own_recipe("setup.py"))
    library = next(lib for lib in build.libraries if "_scale" in lib)
    changed = SCALE.replace("scale_kernel", "scale_fast_kernel")
    made = builder.candidate(build, library, {"csrc/scale.cu": changed}, "cand1")
    assert made.ok, made.tail
    assert made.artifact is not None and "cand1" in str(made.artifact)
    assert "nvcc csrc/scale.cu" in made.tail and "shift.cu" not in made.tail  # only its own
    fast = KernelDef(name="scale_fast_kernel", namespace="rowpkg", file="csrc/scale.cu",
                     line=5)
    assert holders(fast, [made.artifact])
    assert not holders(fast, [build.original / library])  # the original is untouched
    assert (build.workshop / "csrc/scale.cu").read_text() == SCALE


def test_a_changed_header_rebuilds_what_includes_it(built: tuple[Path, OwnBuilder]) -> None:
    root, builder = built
    build = builder.original(root, own_recipe("setup.py"))
    library = next(lib for lib in build.libraries if "_shift" in lib)
    made = builder.candidate(build, library, {"csrc/common.cuh": COMMON.replace("128", "256")},
                             "cand2")
    assert made.ok, made.tail
    assert "nvcc csrc/shift.cu" in made.tail
    assert (build.workshop / "csrc/common.cuh").read_text() == COMMON


def test_a_failing_build_says_why_with_its_own_lines(tmp_path: Path) -> None:
    root = _repo(tmp_path / "repo")
    (root / "csrc" / "shift.cu").write_text(SHIFT.replace("x[i] += 1;", "x[i] += ;"))
    builder = OwnBuilder(tmp_path / "cache", timeout_s=300)
    build = builder.original(root, own_recipe("setup.py"))
    assert not build.ok
    assert "`python -u setup.py build_ext --inplace` exited with code 1" in build.why
    assert "shift.cu" in build.evidence() and "error" in build.evidence()
    again = builder.original(root, own_recipe("setup.py"))
    assert again.cached and not again.ok  # the same content fails the same way


def test_a_build_past_its_budget_is_stopped(tmp_path: Path) -> None:
    root = _repo(tmp_path / "repo", "import time\nprint('configuring', flush=True)\n"
                 "time.sleep(60)\n")
    beats: list[str] = []
    builder = OwnBuilder(tmp_path / "cache", timeout_s=2, progress=beats.append,
                         heartbeat_s=0.5)
    build = builder.original(root, own_recipe("setup.py"))
    assert not build.ok and "did not finish in" in build.why
    assert any("s so far; last output: configuring" in b for b in beats)


@pytest.mark.parametrize("text,expected", [
    ("void ops::(anonymous namespace)::k<float, 128>(float const*, float*, int)",
     ("ops", "k", ("float", "128"))),
    ("ops::plain(float*, int)", ("ops", "plain", ())),
    ("void at::native::(anonymous namespace)::f<float, Epi<float> >(float*)",
     ("at::native", "f", ("float", "Epi<float>"))),
    ("c_kernel", ("", "c_kernel", ())),
])
def test_demangled_names_split_into_what_a_definition_has(
        text: str, expected: tuple[str, str, tuple[str, ...]]) -> None:
    symbol = parse_symbol(textwrap.dedent(text))
    assert symbol is not None
    assert (symbol.namespace, symbol.name, symbol.template_args) == expected


def test_derived_names_are_not_kernels() -> None:
    assert parse_symbol("__device_stub__Z8c_kernelPf(float*)") is None
    assert parse_symbol("void ops::__wrapper__device_stub_k<float>(float*&)") is None


def test_the_task_finds_its_library_and_says_so(built: tuple[Path, OwnBuilder]) -> None:
    root, builder = built
    recipe = BuildRecipe(kind="repository", name="", file="setup.py", line=1)
    task = KernelTask(kernel_id="csrc/scale.cu::rowpkg::scale_kernel", kernel_name="scale_kernel",
                      root=root, build=recipe, op=OpBinding("torch_op", "rowpkg", "scale"),
                      references=(), unusable_references=(), test_targets=(),
                      editable_files=("csrc/scale.cu",), definition=SCALE_KERNEL)
    own = own_original(root, own_recipe("setup.py"), builder, SCALE_KERNEL)
    assert own.ok and own.module == "rowpkg._scale"
    result = own.result()
    assert result.ok and result.module_name == "_scale" and result.artifact is not None
    step = own_build_step(task, own)
    assert step.outcome == "ok"
    assert "the kernel is in rowpkg._scale (_scale." in step.summary
    assert "(registered name)" in step.summary or "(symbol table)" in step.summary

    missing = KernelDef(name="gone_kernel", namespace="rowpkg", file="csrc/gone.cu", line=1)
    lost = own_original(root, own_recipe("setup.py"), builder, missing)
    step = own_build_step(task, lost)
    assert step.outcome == "failed"
    assert "none of them holds rowpkg::gone_kernel" in step.summary
    # The kfbot.yaml names the libraries the build made, not a placeholder.
    assert "kind: repository" in step.suggestion and "name: rowpkg._scale" in step.suggestion


def test_only_the_most_recent_builds_are_kept(tmp_path: Path) -> None:
    """Each commit is a new build; the cache keeps the last few, not every one."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    builder = OwnBuilder(tmp_path / "cache", timeout_s=60)
    keys = []
    for n in range(6):
        # A "library" written by the setup script itself: all the builder looks for.
        (root / "setup.py").write_text(
            f"import os\nos.makedirs('pkg', exist_ok=True)\n"
            f"open('pkg/_ops{n}.so', 'wb').write(b'not really')\n")
        build = builder.original(root, own_recipe("setup.py"))
        assert build.ok, build.tail
        keys.append(build.key)
    kept = {p.parent.name for p in (tmp_path / "cache").glob("*/result.json")}
    assert kept == set(keys[-4:])
    assert not (tmp_path / "cache" / keys[0] / "original").exists()


def test_a_candidate_library_registers_its_ops_under_its_own_namespace(tmp_path: Path) -> None:
    """Two libraries, an op each, registered the older way: a candidate of the first
    renames that op's registration (so it loads beside the original), and leaves the
    second library's files alone (they are not compiled again)."""
    tree = tmp_path / "original"
    (tree / "csrc").mkdir(parents=True)
    scale = ('#include "rowlib.h"\nstatic auto registry = torch::RegisterOperators()'
             '.op("rowlib::row_scale", &row_scale);\n')
    shift = scale.replace("scale", "shift")
    (tree / "csrc" / "row_scale.cpp").write_text(scale)
    (tree / "csrc" / "row_shift.cpp").write_text(shift)
    library = tree / "rowlib" / "_row_scale.so"
    library.parent.mkdir()
    library.write_bytes(b"\0ELF...\0rowlib::row_scale\0...")  # its registration string
    build = OwnBuild(own_recipe("setup.py"), "k", tmp_path / "workshop", tree,
                     ("rowlib/_row_scale.so",), True, "built", "", 1.0)
    regs = registrations(build, library)
    assert sorted(regs.texts) == ["csrc/row_scale.cpp"] and regs.owned == {"rowlib"}
    files, names = regs.renamed({"csrc/cuda/row_scale_cuda.cu": "// faster\n"}, "abc123")
    assert names == {"rowlib": "rowlib_kfabc123"}
    assert '.op("rowlib_kfabc123::row_scale", &row_scale)' in files["csrc/row_scale.cpp"]
    assert sorted(files) == ["csrc/cuda/row_scale_cuda.cu", "csrc/row_scale.cpp"]


def test_observing_runs_in_the_built_tree_and_its_mutant_copy(
        built: tuple[Path, OwnBuilder]) -> None:
    """The tree the observer runs the tests in, and the copy whose library holds the
    kernel with its body emptied (a test that still passes there does not check it)."""
    root, builder = built
    report = scan(root, Config())
    kernel = next(k for k in report.kernels if k.name == "scale_kernel")
    (recipe,) = kernel.builds
    assert recipe.kind == "repository"
    tree = own_tree(root, recipe, builder.cache_dir, {"PYTHONPATH": "/elsewhere"})
    assert not isinstance(tree, str)
    original = builder.original(root, own_recipe("setup.py")).original
    assert tree[0] == original
    assert tree[1]["PYTHONPATH"].split(os.pathsep) == [str(original), "/elsewhere"]
    mutant = own_mutant_tree(root, kernel, recipe, builder.cache_dir, {})
    assert not isinstance(mutant, NoMutant), mutant
    library = next(p for p in original.glob("rowpkg/_scale*.so"))
    swapped = mutant[0] / library.relative_to(original)
    assert swapped.read_bytes() != library.read_bytes()  # the mutant's library
    assert holders(SCALE_KERNEL, [swapped])  # the kernel is still there, writing nothing
    other = next(p for p in original.glob("rowpkg/_shift*.so"))
    assert (mutant[0] / other.relative_to(original)).read_bytes() == other.read_bytes()
