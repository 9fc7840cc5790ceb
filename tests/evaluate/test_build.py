"""The build stage: staging, flags, the object cache, linking, names and missing tools.

Compiles here are real (nvcc and the C++ compiler with torch's headers). A compile
that includes torch takes 20-45 s on a small machine, so one builder cache serves the
whole module and the torch-heavy objects are compiled as few times as possible;
everything that can be checked on the plan (keys, staged texts) is checked there.
On a CPU-only torch, linking a CUDA extension cannot succeed: the tests expect the
clear link diagnostic then, and a loadable artifact where torch has its CUDA libraries.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.build import (
    Builder,
    BuildRequest,
    BuildResult,
    arch_list,
    module_name,
    rename_registrations,
)
from kfbot.evaluate.build.diagnostics import parse_ptxas_resources
from kfbot.evaluate.candidate import Candidate
from kfbot.scan.model import BuildRecipe
from kfbot.scan.python.facts import extract_python_facts

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ELEMENTWISE = FIXTURES / "load_elementwise"
GELU_CU = "csrc/gelu_kernel.cu"


def _torch_headers() -> bool:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "include" / "torch" / "extension.h").exists()


def _torch_has_cuda_libraries() -> bool:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent / "lib" / "libtorch_cuda.so").exists()


HAVE_TOOLCHAIN = shutil.which("nvcc") is not None and _torch_headers()


def _recipe(name: str, file: str, sources: tuple[str, ...], **more: object) -> BuildRecipe:
    return BuildRecipe(kind="load", name=name, file=file, line=1, sources=sources, **more)  # type: ignore[arg-type]


ELEMENTWISE_RECIPE = _recipe(
    "elementwise_ext", "elementwise.py", ("csrc/gelu.cpp", GELU_CU), extra_cuda_cflags=("-O3",)
)


def _candidate(files: dict[str, str]) -> BuildRequest:
    return BuildRequest(
        ELEMENTWISE_RECIPE, ELEMENTWISE, files=files, tag=Candidate(files=files).short
    )


def _gelu(old: str, new: str) -> dict[str, str]:
    text = (ELEMENTWISE / GELU_CU).read_text()
    assert old in text
    return {GELU_CU: text.replace(old, new)}


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    if not HAVE_TOOLCHAIN:
        pytest.skip("needs nvcc on PATH and torch's C++ extension headers")
    return Builder(tmp_path_factory.mktemp("kfbot-build-cache"), arch="90", jobs=2)


@pytest.fixture(scope="module")
def original(builder: Builder) -> BuildResult:
    return builder.build(BuildRequest(ELEMENTWISE_RECIPE, ELEMENTWISE))


@pytest.fixture(scope="module")
def candidate(builder: Builder, original: BuildResult) -> BuildResult:
    return builder.build(_candidate(_gelu("kBlockSize = 128", "kBlockSize = 256")))


# --- whole builds (the only torch-heavy compiles: gelu.cpp once, a small C++ op once) --


def test_original_compiles_every_object_and_reports_kernel_resources(original: BuildResult) -> None:
    assert (original.compiled, original.reused) == (2, 0)
    assert original.module_name == "elementwise_ext_kforig"
    gelu = [r for r in original.resources if r.kernel.startswith("gelu_kernel")]
    assert gelu and gelu[0].arch == "sm_90" and gelu[0].registers > 0
    assert any(d.kind == "resources" and "gelu_kernel" in d.message for d in original.diagnostics)
    if _torch_has_cuda_libraries():
        assert original.ok and original.stage == "done", original.diagnostics
        assert original.artifact is not None and original.artifact.exists()
        assert original.artifact.name == "elementwise_ext_kforig.so"
    else:
        assert (original.ok, original.stage, original.artifact) == (False, "link", None)
        messages = [d.message for d in original.diagnostics if d.kind == "link_error"]
        assert any(
            m.startswith("cannot find -ltorch_cuda: this torch has no CUDA libraries")
            for m in messages
        ), messages


def test_candidate_recompiles_only_the_changed_kernel_file(
    original: BuildResult, candidate: BuildResult
) -> None:
    assert (candidate.compiled, candidate.reused) == (1, 1)
    assert candidate.stage == original.stage
    assert candidate.key != original.key
    assert candidate.module_name != original.module_name


def test_same_candidate_again_compiles_nothing(builder: Builder, candidate: BuildResult) -> None:
    again = builder.build(_candidate(_gelu("kBlockSize = 128", "kBlockSize = 256")))
    assert (again.compiled, again.reused) == (0, 2)
    assert again.key == candidate.key
    # A reused object still reports what ptxas said when it was compiled.
    assert [r.kernel for r in again.resources] == [r.kernel for r in candidate.resources]


def test_parallel_builds_of_one_new_object_compile_it_once(
    builder: Builder, original: BuildResult
) -> None:
    files = _gelu("kBlockSize = 128", "kBlockSize = 512")
    first = _candidate(files)
    second = BuildRequest(ELEMENTWISE_RECIPE, ELEMENTWISE, files=files, tag="twin")
    results = builder.build_many([first, second])
    assert [r.module_name for r in results] == [
        first.recipe.name + "_kf" + first.tag,
        "elementwise_ext_kftwin",
    ]
    assert sum(r.compiled for r in results) == 1
    assert sum(r.reused for r in results) == 3


def test_broken_candidate_fails_at_compile_with_the_line(
    builder: Builder, original: BuildResult
) -> None:
    broken = _gelu("float v = x[i];", "float v = x[i] * undefined_scale;")
    line = broken[GELU_CU].splitlines().index("        float v = x[i] * undefined_scale;") + 1
    result = builder.build(_candidate(broken))
    assert (result.ok, result.stage, result.artifact) == (False, "compile", None)
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert errors, result.diagnostics
    assert (errors[0].file, errors[0].line) == (GELU_CU, line)
    assert "undefined_scale" in errors[0].message
    assert result.reused == 1  # the bindings object was not touched


def test_cpu_extension_links_imports_and_registers_renamed_ops(
    builder: Builder, tmp_path: Path
) -> None:
    """A C++-only extension links against any torch: the whole path, import included."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "twice.cpp").write_text(
        "#include <torch/extension.h>\n"
        "torch::Tensor twice(torch::Tensor x) { return x * 2; }\n"
        'TORCH_LIBRARY(kfcpu, m) { m.def("twice(Tensor x) -> Tensor"); }\n'
        'TORCH_LIBRARY_IMPL(kfcpu, CPU, m) { m.impl("twice", &twice); }\n'
        'PYBIND11_MODULE(twice_ext, m) { m.def("twice", &twice); }\n'
    )
    recipe = _recipe("twice_ext", "setup.py", ("csrc/twice.cpp",))
    result = builder.build(BuildRequest(recipe, tmp_path, tag="t1"))
    assert result.ok and result.artifact is not None, result.diagnostics
    assert result.library_namespaces == {"kfcpu": "kfcpu_kft1"}
    script = (
        "import importlib.util, sys, torch\n"
        "name, path = sys.argv[1], sys.argv[2]\n"
        "spec = importlib.util.spec_from_file_location(name, path)\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "x = torch.arange(3.0)\n"
        "print(module.twice(x).tolist(), torch.ops.kfcpu_kft1.twice(x).tolist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, result.module_name, str(result.artifact)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[0.0, 2.0, 4.0] [0.0, 2.0, 4.0]"


# --- plans and staging: no compiles ---------------------------------------------------


def test_params_change_only_the_objects_that_use_them(builder: Builder) -> None:
    root = FIXTURES / "tunables_matmul"
    recipe = _recipe(
        "matmul_ext",
        "matmul_ops.py",
        ("csrc/matmul.cpp", "csrc/matmul.cu"),
        defines=(("TILE", "16"),),
        extra_cuda_cflags=("-O3", "-DTILE=16", "--use_fast_math"),
    )
    base = builder.plan(BuildRequest(recipe, root))
    tuned = builder.plan(BuildRequest(recipe, root, params={"TILE": "32"}, tag="t32"))
    cpp, cu = base.objects
    cpp32, cu32 = tuned.objects
    assert cu.key != cu32.key
    assert "-DTILE=32" in cu32.command and "-DTILE=16" not in cu32.command
    assert "-DTILE=16" in cu.command
    # matmul.cpp never mentions TILE: its torch-heavy object stays cached.
    assert cpp.key == cpp32.key
    compiled = builder.compile_object(tuned, cu32)
    assert compiled.ok, compiled.log
    tiled = [r for r in parse_ptxas_resources(compiled.log) if r.kernel.startswith("matmul_tiled")]
    assert tiled and tiled[0].shared_bytes == 2 * 32 * 32 * 4  # As and Bs, TILE x TILE floats


def test_header_change_changes_every_object_that_includes_it(builder: Builder) -> None:
    root = FIXTURES / "templated_headers"
    recipe = _recipe(
        "scale_ext",
        "scale_ops.py",
        ("csrc/scale.cpp", "csrc/scale_forward.cu", "csrc/scale_backward.cu"),
        extra_cuda_cflags=("-O3",),
        include_dirs=("include",),
    )
    header = (root / "include" / "scale.cuh").read_text()
    edited = {"include/scale.cuh": header.replace("kScaleThreads = 256", "kScaleThreads = 128")}
    base = builder.plan(BuildRequest(recipe, root))
    changed = builder.plan(BuildRequest(recipe, root, files=edited, tag="hdr"))
    staged = base.staging.directory / "include" / "scale.cuh"
    assert staged.read_text() == header
    assert (changed.staging.directory / "include" / "scale.cuh").read_text() == edited[
        "include/scale.cuh"
    ]
    assert "-Iinclude" in base.objects[1].command
    keys = {o.source: o.key for o in base.objects}
    new_keys = {o.source: o.key for o in changed.objects}
    assert new_keys["csrc/scale.cpp"] == keys["csrc/scale.cpp"]
    assert new_keys["csrc/scale_forward.cu"] != keys["csrc/scale_forward.cu"]
    assert new_keys["csrc/scale_backward.cu"] != keys["csrc/scale_backward.cu"]


def test_torch_library_namespaces_are_renamed_per_candidate(builder: Builder) -> None:
    root = FIXTURES / "torch_library_layernorm"
    recipe = _recipe("kfln_ops", "layernorm_ops.py", ("csrc/layernorm.cu",))
    staging = builder.stage(BuildRequest(recipe, root, tag="c0ffee1234"))
    text = (staging.directory / "csrc" / "layernorm.cu").read_text()
    assert "TORCH_LIBRARY(kfln_kfc0ffee1234, m)" in text
    assert "TORCH_LIBRARY_IMPL(kfln_kfc0ffee1234, CUDA, m)" in text
    assert "TORCH_LIBRARY(kfln, m)" not in text
    assert staging.library_namespaces == {"kfln": "kfln_kfc0ffee1234"}
    original = (root / "csrc" / "layernorm.cu").read_text()
    assert len(text.splitlines()) == len(original.splitlines())
    assert not staging.python_module


def test_namespaces_named_by_macros_are_renamed_too(builder: Builder) -> None:
    """torch_ops_multi defines `kfops` through TORCH_LIBRARY_EXPAND(KFOPS_NAMESPACE, m)
    and adds to it with a plain TORCH_LIBRARY_FRAGMENT(kfops, m): both must follow, or
    the original and a candidate register one namespace twice in the worker."""
    root = FIXTURES / "torch_ops_multi"
    recipe = _recipe("kfops_ext", "kfops/__init__.py",
                     ("csrc/ops.cpp", "csrc/fragment.cpp"), include_dirs=("csrc",))
    staging = builder.stage(BuildRequest(recipe, root, tag="t1"))
    ops = (staging.directory / "csrc" / "ops.cpp").read_text()
    fragment = (staging.directory / "csrc" / "fragment.cpp").read_text()
    assert "TORCH_LIBRARY_EXPAND(kfops_kft1, m)" in ops
    assert "TORCH_LIBRARY_IMPL(kfops_kft1, CUDA, m)" in ops
    assert "TORCH_LIBRARY_FRAGMENT(kfops_kft1, m)" in fragment
    assert "TORCH_LIBRARY_IMPL_EXPAND(kfops_kft1, CUDA, m)" in fragment
    assert staging.library_namespaces == {"kfops": "kfops_kft1", "KFOPS_NAMESPACE": "kfops_kft1"}
    real = builder.stage(BuildRequest(recipe, root, tag="repo", real_names=True))
    assert "TORCH_LIBRARY_EXPAND(KFOPS_NAMESPACE, m)" in \
        (real.directory / "csrc" / "ops.cpp").read_text()
    assert real.library_namespaces == {"kfops": "kfops", "KFOPS_NAMESPACE": "kfops"}


def test_rename_registrations_leaves_torch_namespaces_and_comments_alone() -> None:
    text = (
        "// TORCH_LIBRARY(ops, m) in a comment\n"
        'TORCH_LIBRARY(ops, m) { m.def("ops::f(Tensor x) -> Tensor"); }\n'
        'TORCH_LIBRARY_IMPL(aten, CUDA, m) { m.impl("relu", &relu); }\n'
        "PYBIND11_MODULE(my_ext, m) {}\n"
    )
    renamed = rename_registrations(text, {"ops": "ops_kfx"})
    assert renamed.splitlines() == [
        "// TORCH_LIBRARY(ops, m) in a comment",
        'TORCH_LIBRARY(ops_kfx, m) { m.def("ops_kfx::f(Tensor x) -> Tensor"); }',
        'TORCH_LIBRARY_IMPL(aten, CUDA, m) { m.impl("relu", &relu); }',
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}",
    ]


def test_load_inline_sources_are_written_as_torch_writes_them(builder: Builder) -> None:
    root = FIXTURES / "inline_softmax"
    facts = extract_python_facts("softmax_inline.py", (root / "softmax_inline.py").read_bytes())
    request = BuildRequest(facts.builds[0], root, inline_sources=facts.inline_sources)
    staging = builder.stage(request)
    committed = root / "build" / "inline_softmax"
    for name in ("main.cpp", "cuda.cu"):
        staged = (staging.directory / name).read_text()
        # torch's copy names the module through the TORCH_EXTENSION_NAME macro too.
        assert staged == (committed / name).read_text()
    assert staging.python_module
    # Compiler lines in the generated cuda.cu point back into the Python file.
    cuda = staging.files["cuda.cu"]
    line = next(n for n, text in enumerate(cuda.text.splitlines(), 1) if "__global__" in text)
    file, py_line = cuda.locate(line)
    assert file == "softmax_inline.py" and py_line is not None
    python = (root / "softmax_inline.py").read_text().splitlines()
    assert python[py_line - 1].startswith("__global__ void softmax_kernel")


def test_missing_source_is_a_stage_failure(builder: Builder) -> None:
    recipe = _recipe("gone_ext", "gone.py", ("csrc/gone.cu",))
    result = builder.build(BuildRequest(recipe, ELEMENTWISE))
    assert (result.ok, result.stage, result.compiled) == (False, "stage", 0)
    assert result.diagnostics[0].file == "csrc/gone.cu"


# --- names and tools ------------------------------------------------------------------


def test_names_and_architectures() -> None:
    assert module_name("elementwise_ext", "0123456789") == "elementwise_ext_kf0123456789"
    assert module_name("pkg.sub._C", "orig") == "_C_kforig"
    assert [arch_list(a) for a in ("90", "sm_90a", "100", "8.6")] == ["9.0", "9.0a", "10.0", "8.6"]
    with pytest.raises(KfbotError):
        arch_list("hopper")


def test_missing_nvcc_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(KfbotError) as raised:
        Builder(tmp_path / "cache", arch="90")
    assert raised.value.exit_code == EXIT_MISSING_TOOL
    message = str(raised.value)
    assert message.startswith("nvcc not found") and "\n" not in message
    assert os.environ["PATH"] == str(tmp_path)


def test_missing_torch_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is checked first")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(KfbotError) as raised:
        Builder(tmp_path / "cache", arch="90")
    assert raised.value.exit_code == EXIT_MISSING_TOOL
    assert str(raised.value).startswith("torch is not installed")


def test_importing_the_builder_does_not_import_torch() -> None:
    code = "import sys, kfbot.evaluate.build; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_nvcc_flag_params_reach_device_compiles_only() -> None:
    from kfbot.evaluate.build.cpp_extension import TorchFlags
    from kfbot.evaluate.build.flags import compile_command as _command
    from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM

    flags = TorchFlags(cxx=("g++",), nvcc=("nvcc",), cflags=("-O2",), post_cflags=(),
                       cuda_cflags=("-O3",), cuda_post_cflags=(), cuda_dlink_post_cflags=(),
                       ldflags=())
    params = {NVCC_FLAGS_PARAM: "--use_fast_math", "TILE": "32"}
    cuda = _command(flags, "k.cu", True, params, "int a[TILE];")
    assert cuda[-2:] == ("-DTILE=32", "--use_fast_math")
    assert not any(NVCC_FLAGS_PARAM in part for part in cuda)
    host = _command(flags, "b.cpp", False, params, "int b;")
    assert "--use_fast_math" not in host and not any(NVCC_FLAGS_PARAM in p for p in host)


def test_build_commands_see_no_secrets(builder: Builder, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiler runs on candidate source, which could #include /proc/self/environ.
    for name in ("GITHUB_TOKEN", "ANTHROPIC_API_KEY", "INPUT_TOKEN"):
        monkeypatch.setenv(name, "s3cr3t-value")
    done = builder._run(["env"], tmp_path, timeout=30)
    assert done.returncode == 0
    assert "PATH=" in done.output and "s3cr3t-value" not in done.output
