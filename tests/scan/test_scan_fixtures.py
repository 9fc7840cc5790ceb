"""End-to-end: `kfbot scan --json` on every fixture repository, exact expected facts.

The expectations were written from the fixture sources (file:line of each kernel,
launch, binding and comparison), independently of the scanner's output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kfbot.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
SCHEMA = json.loads((ROOT / "kfbot" / "schemas" / "scan-v1.json").read_text())

Report = dict[str, Any]
_cache: dict[str, Report] = {}


def report(name: str, capsys: pytest.CaptureFixture[str]) -> Report:
    if name not in _cache:
        assert main(["scan", str(FIXTURES / name), "--json"]) == 0
        _cache[name] = json.loads(capsys.readouterr().out)
        jsonschema.validate(_cache[name], SCHEMA)
    return _cache[name]


def kernels(name: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Report]:
    return {k["id"]: k for k in report(name, capsys)["kernels"]}


def launches(k: Report) -> list[tuple[Any, ...]]:
    return [(s["file"], s["line"], s["host_function"], tuple(s["template_args"]), s["style"])
            for s in k["launch_sites"]]


def bindings(k: Report) -> list[tuple[str, str, str]]:
    return [(b["kind"], b["module"], b["name"]) for b in k["bindings"]]


def builds(k: Report) -> list[tuple[str, str, str]]:
    return [(b["kind"], b["name"], b["file"]) for b in k["builds"]]


def tunables(k: Report) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {(t["name"], t["value"], t["kind"], tuple(t["values_seen"])) for t in k["tunables"]}


def references(k: Report) -> list[tuple[str, int, str, str]]:
    return [(r["file"], r["line"], r["test"], r["reference"]) for r in k["references"]]


def test_example(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("example", capsys)
    assert sorted(ks) == ["csrc/matmul.cu::matmul_kernel", "csrc/softmax.cu::softmax_kernel",
                          "csrc/vector_add.cu::saxpy_kernel"]
    softmax = ks["csrc/softmax.cu::softmax_kernel"]
    assert softmax["line"] == 8
    assert launches(softmax) == [("csrc/softmax.cu", 22, "softmax_launch", (), "chevron")]
    assert bindings(softmax) == [("pybind11", "kernels_demo_ext", "softmax")]
    assert builds(softmax) == [("load", "kernels_demo_ext", "kernels_demo/__init__.py")]
    assert tunables(softmax) == {("BLOCK", "128", "define", ())}
    assert references(softmax) == [
        ("tests/test_ops.py", 13, "test_softmax", "torch.softmax(x, dim=-1)")]
    matmul = ks["csrc/matmul.cu::matmul_kernel"]
    assert (matmul["line"], launches(matmul)[0][1]) == (10, 32)
    assert tunables(matmul) == {("TILE", "16", "ifndef_default", ())}
    assert references(matmul) == [("tests/test_ops.py", 21, "test_matmul", "a @ b")]
    saxpy = ks["csrc/vector_add.cu::saxpy_kernel"]
    assert (saxpy["line"], launches(saxpy)[0][1]) == (7, 14)
    assert tunables(saxpy) == {("kThreads", "256", "constexpr", ())}
    assert references(saxpy) == [("tests/test_ops.py", 30, "test_saxpy", "a * x + b")]
    assert softmax["references"][0]["shapes"] == ["(4096, 1024)", "(1, 1)", "(7, 33)",
                                                  "(3, 5, 1000)"]
    assert softmax["references"][0]["dtypes"] == ["float32"]


def test_inline_softmax_ignores_the_committed_build_copy(
        capsys: pytest.CaptureFixture[str]) -> None:
    rep = report("inline_softmax", capsys)
    assert rep["skipped_dirs"] == ["build"]
    (k,) = rep["kernels"]
    assert (k["id"], k["line"]) == ("softmax_inline.py::softmax_kernel", 11)
    assert launches(k) == [("softmax_inline.py", 35, "softmax", (), "chevron")]
    assert bindings(k) == [("pybind11", "inline_softmax", "softmax")]
    (build,) = k["builds"]
    assert (build["kind"], build["name"], build["line"], build["functions"], build["inline"]) == (
        "load_inline", "inline_softmax", 49, ["softmax"], True)
    assert build["extra_cuda_cflags"] == ["-O3"]
    assert tunables(k) == {("threads", "128", "const", ())}
    assert references(k) == [
        ("tests/test_softmax.py", 19, "test_softmax_matches_torch", "torch.softmax(x, dim=-1)"),
        ("tests/test_softmax.py", 26, "test_softmax_large_logits", "torch.softmax(x, dim=-1)")]


def test_load_elementwise(capsys: pytest.CaptureFixture[str]) -> None:
    (k,) = report("load_elementwise", capsys)["kernels"]
    assert (k["id"], k["line"]) == ("csrc/gelu_kernel.cu::gelu_kernel", 7)
    assert launches(k) == [("csrc/gelu_kernel.cu", 19, "launch_gelu", (), "chevron")]
    assert [(b["file"], b["line"], b["cpp_function"]) for b in k["bindings"]] == [
        ("csrc/gelu.cpp", 19, "gelu_forward")]
    assert builds(k) == [("load", "elementwise_ext", "elementwise.py")]
    assert k["builds"][0]["sources"] == ["csrc/gelu.cpp", "csrc/gelu_kernel.cu"]
    assert tunables(k) == {("kBlockSize", "128", "constexpr", ())}
    (ref,) = k["references"]
    assert (ref["file"], ref["line"], ref["test"], ref["comparison"]) == (
        "tests/test_gelu.py", 17, "test_gelu_matches_torch", "torch.allclose")
    assert ref["reference"] == "F.gelu(x, approximate='tanh')"


def test_setup_rowsum(capsys: pytest.CaptureFixture[str]) -> None:
    (k,) = report("setup_rowsum", capsys)["kernels"]
    assert (k["id"], k["line"]) == ("rowsum_kernel.cu::rowsum_kernel", 12)
    assert launches(k) == [("rowsum_kernel.cu", 28, "launch_rowsum", (), "chevron")]
    assert bindings(k) == [("pybind11", "rowsum_ext", "rowsum")]
    (build,) = k["builds"]
    assert (build["kind"], build["name"], build["file"], build["line"]) == (
        "setup_py", "rowsum_ext", "setup.py", 8)
    assert build["sources"] == ["rowsum.cpp", "rowsum_kernel.cu"]
    assert build["defines"] == [["BLOCK_SIZE", "256"]]
    assert tunables(k) == {("BLOCK_SIZE", "128", "ifndef_default", ()),
                           ("BLOCK_SIZE", "256", "build_flag", ())}
    assert references(k) == [
        ("tests/test_rowsum.py", 16, "test_rowsum_matches_torch", "x.sum(dim=1)")]
    assert k["references"][0]["module_hint"] == "rowsum_ext"


def test_torch_library_layernorm(capsys: pytest.CaptureFixture[str]) -> None:
    (k,) = report("torch_library_layernorm", capsys)["kernels"]
    assert (k["id"], k["line"]) == ("csrc/layernorm.cu::layernorm_kernel", 7)
    assert launches(k) == [("csrc/layernorm.cu", 45, "layernorm_cuda", (), "chevron")]
    assert [(b["kind"], b["module"], b["name"], b["line"], b["dispatch_key"])
            for b in k["bindings"]] == [
        ("torch_library", "kfln", "layernorm", 54, None),
        ("torch_library_impl", "kfln", "layernorm", 58, "CUDA")]
    assert builds(k) == [("load", "kfln_ops", "layernorm_ops.py")]
    assert tunables(k) == {("threads", "64", "const", ())}
    (ref,) = k["references"]
    assert (ref["line"], ref["op"], ref["module_hint"], ref["reference"]) == (
        23, "torch.ops.kfln.layernorm", "kfln",
        "F.layer_norm(x, (x.shape[-1],), w, b, 1e-05)")
    assert ref["confidence"] == 0.9


def test_templated_headers(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("templated_headers", capsys)
    assert sorted(ks) == ["include/scale.cuh::bwd::scale_kernel",
                          "include/scale.cuh::fwd::scale_kernel"]
    fwd = ks["include/scale.cuh::fwd::scale_kernel"]
    bwd = ks["include/scale.cuh::bwd::scale_kernel"]
    assert (fwd["line"], fwd["namespace"], bwd["line"], bwd["namespace"]) == (13, "fwd", 28, "bwd")
    assert [(t["kind"], t["name"]) for t in fwd["template_params"]] == [
        ("type", "T"), ("value", "VEC")]
    assert launches(fwd) == [
        ("csrc/scale_forward.cu", 8, "scale_forward_launch", ("float", "4"), "chevron"),
        ("csrc/scale_forward.cu", 11, "scale_forward_launch", ("float", "1"), "chevron"),
        ("csrc/scale_forward.cu", 23, "scale_forward_launch_on", ("float", "1"),
         "cudaLaunchKernel")]
    assert launches(bwd) == [
        ("csrc/scale_backward.cu", 6, "scale_backward_launch", ("float",), "chevron")]
    assert bindings(fwd) == [("pybind11", "scale_ext", "scale_forward")]
    assert bindings(bwd) == [("pybind11", "scale_ext", "scale_backward")]
    assert fwd["builds"][0]["include_dirs"] == ["include"]
    assert tunables(fwd) == {("kScaleThreads", "256", "constexpr", ()),
                             ("VEC", "1", "template_arg", ("1", "4"))}
    # test_scale_autograd reaches both through `scale` -> Scale.apply: forward through
    # its output, backward through x.grad.
    assert references(fwd) == [
        ("tests/test_scale.py", 22, "test_scale_forward", "x * alpha"),
        ("tests/test_scale.py", 35, "test_scale_forward_on_side_stream", "x * alpha"),
        ("tests/test_scale.py", 54, "test_scale_autograd", "x.detach() * 1.5")]
    assert references(bwd) == [("tests/test_scale.py", 43, "test_scale_backward", "grad * alpha"),
                               ("tests/test_scale.py", 55, "test_scale_autograd", "grad * 1.5")]
    assert [r["backward"] for r in bwd["references"]] == [False, True]
    assert fwd["editable_files"] == ["csrc/scale_forward.cu", "include/scale.cuh"]


def test_tunables_matmul(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("tunables_matmul", capsys)
    tiled, bias = ks["csrc/matmul.cu::matmul_tiled"], ks["csrc/matmul.cu::add_bias_kernel"]
    assert (tiled["line"], tiled["launch_bounds"]) == (15, ["TILE * TILE", "kMinBlocks"])
    assert launches(tiled) == [("csrc/matmul.cu", 48, "matmul_launch", (), "chevron")]
    assert tunables(tiled) == {("TILE", "16", "ifndef_default", ()),
                               ("kUnroll", "4", "constexpr", ()),
                               ("kMinBlocks", "2", "const", ()),
                               ("TILE", "16", "build_flag", ())}
    assert bindings(tiled) == [("pybind11", "matmul_ext", "matmul"),
                               ("pybind11", "matmul_ext", "matmul_bias")]
    assert tiled["builds"][0]["extra_cuda_cflags"] == ["-O3", "-DTILE=16", "--use_fast_math"]
    assert launches(bias) == [("csrc/matmul.cu", 56, "add_bias_launch", ("256",), "chevron"),
                              ("csrc/matmul.cu", 58, "add_bias_launch", ("128",), "chevron")]
    assert bindings(bias) == [("pybind11", "matmul_ext", "matmul_bias")]
    assert tunables(bias) == {("BLOCK", "128", "template_arg", ("128", "256")),
                              ("add_bias_launch:block", "256", "launch_config", ()),
                              ("add_bias_launch:block", "128", "launch_config", ())}
    assert references(tiled) == [
        ("tests/test_matmul.py", 22, "test_matmul_matches_torch", "a @ b"),
        ("tests/test_matmul.py", 31, "test_matmul_bias_matches_addmm", "torch.addmm(bias, a, b)")]
    assert references(bias) == [
        ("tests/test_matmul.py", 31, "test_matmul_bias_matches_addmm", "torch.addmm(bias, a, b)")]


def test_reference_in_a_benchmark_script(capsys: pytest.CaptureFixture[str]) -> None:
    (k,) = report("bench_reference", capsys)["kernels"]
    assert (k["id"], launches(k)) == ("csrc/relu.cu::relu_kernel",
                                      [("csrc/relu.cu", 14, "launch_relu", (), "chevron")])
    assert tunables(k) == {("RELU_THREADS", "256", "define", ())}
    (ref,) = k["references"]
    assert (ref["file"], ref["line"], ref["test"], ref["kind"], ref["comparison"]) == (
        "bench.py", 51, "main", "script", "abs-max-diff")
    assert ref["reference"] == "torch.relu(x)"


def test_kernel_without_reference(capsys: pytest.CaptureFixture[str]) -> None:
    (k,) = report("no_reference", capsys)["kernels"]
    assert k["id"] == "csrc/fill.cu::fill_iota_kernel"
    assert bindings(k) == [("pybind11", "fill_ext", "iota")]
    assert k["references"] == []


def test_declared_task(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("declared_task", capsys)
    assert sorted(ks) == ["csrc/square.cu::square_kernel"]  # third_party/** is excluded
    k = ks["csrc/square.cu::square_kernel"]
    assert k["task"] == "square" and k["editable_files"] == ["csrc/square.cu"]
    declared, discovered = k["references"]
    assert (declared["origin"], declared["file"], declared["line"], declared["op"],
            declared["reference"], declared["shapes"], declared["dtypes"]) == (
        "declared", "kfbot.yaml", 5, "square_ops:square", "ref:square_ref",
        ["(1024,)", "(4096, 33)"], ["float32"])
    assert declared["confidence"] == 1.0
    assert (discovered["origin"], discovered["file"], discovered["reference"]) == (
        "discovered", "tests/test_square.py", "square_ref")


def test_hostile_files_are_reported_and_the_scan_goes_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    rep = report("hostile", capsys)
    names = [k["name"] for k in rep["kernels"]]
    assert "good_kernel" in names and "ok_kernel" in names
    assert sum(n.startswith("gen_kernel_") for n in names) == 14000
    good = next(k for k in rep["kernels"] if k["name"] == "good_kernel")
    assert (good["line"], launches(good)) == (5, [("good.cu", 12, "launch_good", (), "chevron")])
    last = next(k for k in rep["kernels"] if k["name"] == "gen_kernel_13999")
    assert (last["line"], last["launch_sites"][0]["line"]) == (4 + 9 * 13999, 10 + 9 * 13999)
    problems = {(p["file"], p["severity"]): p for p in rep["problems"]}
    assert set(problems) == {("a/b_link", "warning"), ("bad_syntax.py", "warning"),
                             ("broken.cu", "info"), ("empty.cu", "info"),
                             ("junk.cu", "warning"), ("loop", "warning"),
                             ("outside.cu", "warning"), ("rootfs", "warning")}
    for link, target in (("outside.cu", "/etc/hostname"), ("rootfs", "/")):
        assert problems[(link, "warning")]["message"] == (
            f"symbolic link to {os.path.realpath(target)}, outside the repository; not read")
    assert "latin1_kernel" in names
    # Code tree-sitter cannot read may compile: a note, counted, never "syntax errors".
    broken = problems[("broken.cu", "info")]
    assert broken["line"] == 4  # the missing `)`: where the trouble starts
    assert broken["message"] == ("tree-sitter did not understand 5 places (lines 4, 5, 6, 7, "
                                 "10); the rest of the file was read")
    assert problems[("bad_syntax.py", "warning")]["line"] == 7
    assert "binary" in problems[("junk.cu", "warning")]["message"]


# --- the real-world layouts ---------------------------------------------------------------


def _reference_files(k: Report) -> list[str]:
    return sorted({r["file"] for r in k["references"]})


def test_pkg_chain_follows_wrappers_across_modules(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("pkg_chain", capsys)
    fwd = ks["csrc/gelu.cu::fusedact::gelu_fwd_kernel"]
    bwd = ks["csrc/gelu.cu::fusedact::gelu_bwd_kernel"]
    swiglu = ks["csrc/swiglu.cu::fusedact::swiglu_kernel"]
    assert bindings(fwd) == [("pybind11", "fusedact._C", "gelu_fwd")]
    assert [(r["file"], r["line"], r["test"], r["backward"]) for r in fwd["references"]] == [
        ("tests/test_gelu.py", 15, "test_fused_gelu_matches_torch", False),
        ("tests/test_gelu_tanh.py", 14, "test_gelu_tanh_partial", False),
        ("tests/test_gelu_tanh.py", 24, "test_gelu_module", False),
        ("tests/test_gelu_tanh.py", 25, "test_gelu_module", False)]
    assert [(r["line"], r["backward"]) for r in bwd["references"]] == [(26, True)]
    assert [(r["file"], r["line"]) for r in swiglu["references"]] == [
        ("tests/test_swiglu.py", 23), ("tests/test_swiglu.py", 30)]
    first = fwd["references"][0]
    assert first["helper"] == "check (tests/conftest.py:11)"
    assert first["chain"] == [
        "test tests/test_gelu.py:15: test_fused_gelu_matches_torch calls fused_gelu",
        "python fusedact/functional.py:10: fusedact.functional.fused_gelu",
        "python fusedact/_autograd.py:10: fusedact._autograd.GeluFunction.forward",
        "binding csrc/bindings.cpp:48: fusedact._C.gelu_fwd -> gelu_forward",
        "host csrc/bindings.cpp:17: gelu_forward calls fusedact::launch_gelu_fwd",
        "launch csrc/gelu.cu:49: fusedact::launch_gelu_fwd launches gelu_fwd_kernel",
        "kernel csrc/gelu.cu:13: fusedact::gelu_fwd_kernel"]
    assert swiglu["references"][1]["chain"][1] == \
        "python fusedact/layers.py:21: fusedact.layers.GatedActivation.swiglu"
    (build,) = fwd["builds"]
    assert (build["kind"], build["name"], build["extension_class"]) == (
        "setup_py", "fusedact._C", "CUDAExtension")
    assert build["sources"] == ["csrc/bindings.cpp", "csrc/gelu.cu", "csrc/swiglu.cu"]
    assert build["extra_cuda_cflags"] == [
        "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__", "-gencode", "arch=compute_80,code=sm_80",
        "-gencode", "arch=compute_90,code=sm_90"]
    (why,) = build["cannot_tell"]
    assert why.startswith("setup.py:29: `Ext = CUDAExtension if with_cuda else CppExtension`")


def test_torch_ops_multi_pairs_each_kernel_with_its_own_op(
        capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("torch_ops_multi", capsys)
    assert len(ks) == 10
    for k in ks.values():
        (op,) = {b["name"] for b in k["bindings"]}
        assert _reference_files(k) == [f"tests/test_{op}.py"], k["id"]
    clamp = ks["csrc/clamp.cu::clamp_cluster_kernel"]
    assert (clamp["attributes"], clamp["preprocessor"]) == (
        ["__cluster_dims__(2, 1, 1)"], ["#if KFOPS_USE_CLUSTERS"])
    assert ks["csrc/clamp.cu::kfops_clamp_kernel"]["extern_c"]
    warp = ks["csrc/rowmax.cu::kfops::rowmax::rowmax_warp_kernel"]
    assert warp["attributes"] == ["__maxnreg__(64)"]
    (dispatch,) = warp["dispatch"]
    assert (dispatch["op"], dispatch["conditions"], dispatch["by"]) == (
        "kfops.rowmax", ["case at::kFloat of switch (xc.scalar_type())"], ["dtype"])
    naive = ks["csrc/softplus.cu::kfops::softplus::softplus_naive_kernel"]
    (choice,) = naive["dispatch"]
    assert (choice["conditions"], choice["arguments"], choice["by"]) == (
        ["if (algo == 0)"], ["algo"], ["argument"])
    (site,) = naive["launch_sites"]
    assert (site["line"], site["macro"]) == (30, "KFOPS_LAUNCH_1D (csrc/launch.cuh:9)")
    rms = ks["csrc/rmsnorm.cu::kfops::rmsnorm::rmsnorm_kernel"]
    assert rms["params"][0]["type"] == "const __grid_constant__ RowParams"
    assert [(b["module"], b["dispatch_key"], b["reaches"]) for b in rms["bindings"]] == [
        ("kfops", None, []), ("kfops", "CUDA", ["kfops::rmsnorm::launch"])]
    assert [(b["line"], b["dispatch_key"]) for b in
            ks["csrc/softplus.cu::kfops::softplus::softplus_kernel"]["bindings"]] == [
        (59, None), (60, "CUDA")]


def test_script_reference(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("script_reference", capsys)
    (swish,) = ks["csrc/activations.cu::swish_kernel"]["references"]
    (mish,) = ks["csrc/activations.cu::mish_kernel"]["references"]
    assert (swish["file"], swish["kind"], swish["mismatch_signal"], swish["reference"]) == (
        "main.py", "script", "exit_status", "swish_ref")
    assert (mish["file"], mish["comparison"], mish["mismatch_signal"]) == (
        "bench.py", "print", "printed")
    assert mish["confidence"] < swish["confidence"] and "compares by printing" in mish["why"]
    for k in ks.values():
        assert [(b["kind"], b["name"]) for b in k["builds"]] == [
            ("load", "script_act"), ("load", "script_act")]
        assert k["builds"][0]["sources"] == ["csrc/activations.cpp", "csrc/activations.cu"]


def test_kernel_builder_layout(capsys: pytest.CaptureFixture[str]) -> None:
    ks = kernels("kernel_builder", capsys)
    assert sorted(ks) == ["kb_norm/fused_add_rms_norm.cu::kb_norm::fused_add_rms_norm_kernel",
                          "kb_norm/rms_norm.cu::kb_norm::rms_norm_kernel"]
    for k in ks.values():
        (op,) = {b["name"] for b in k["bindings"]}
        assert {b["module"] for b in k["bindings"]} == {"kb_norm"}
        assert [(b["kind"], b["name"], b["package_dir"]) for b in k["builds"]] == [
            ("kernel_builder", "kb_norm", "torch-ext/kb_norm")]
        assert _reference_files(k) == [f"tests/test_{op}.py"]
    rms = ks["kb_norm/rms_norm.cu::kb_norm::rms_norm_kernel"]
    assert [r["line"] for r in rms["references"]] == [18, 27]
    layer = rms["references"][1]
    assert layer["chain"][:2] == [
        "test tests/test_rms_norm.py:27: test_rms_norm_layer calls layer",
        "python torch-ext/kb_norm/layers.py:13: kb_norm.layers.RMSNorm.forward"]


# The pairs the scan found on the first fixtures before it followed chains across
# modules (kfbot at 2379904): every one must still be found, and with no kernel lost.
BEFORE = {
    "example": [("csrc/matmul.cu::matmul_kernel", "tests/test_ops.py:21"),
                ("csrc/softmax.cu::softmax_kernel", "tests/test_ops.py:13"),
                ("csrc/vector_add.cu::saxpy_kernel", "tests/test_ops.py:30")],
    "inline_softmax": [("softmax_inline.py::softmax_kernel", "tests/test_softmax.py:19"),
                       ("softmax_inline.py::softmax_kernel", "tests/test_softmax.py:26")],
    "load_elementwise": [("csrc/gelu_kernel.cu::gelu_kernel", "tests/test_gelu.py:17")],
    "setup_rowsum": [("rowsum_kernel.cu::rowsum_kernel", "tests/test_rowsum.py:16")],
    "torch_library_layernorm": [("csrc/layernorm.cu::layernorm_kernel",
                                 "tests/test_layernorm.py:23")],
    "templated_headers": [("include/scale.cuh::bwd::scale_kernel", "tests/test_scale.py:43"),
                          ("include/scale.cuh::fwd::scale_kernel", "tests/test_scale.py:22"),
                          ("include/scale.cuh::fwd::scale_kernel", "tests/test_scale.py:35")],
    "tunables_matmul": [("csrc/matmul.cu::add_bias_kernel", "tests/test_matmul.py:31"),
                        ("csrc/matmul.cu::matmul_tiled", "tests/test_matmul.py:22"),
                        ("csrc/matmul.cu::matmul_tiled", "tests/test_matmul.py:31")],
    "bench_reference": [("csrc/relu.cu::relu_kernel", "bench.py:51")],
    "no_reference": [],
    "declared_task": [("csrc/square.cu::square_kernel", "kfbot.yaml:5"),
                      ("csrc/square.cu::square_kernel", "tests/test_square.py:15")],
}
KERNELS_BEFORE = {"example": 3, "templated_headers": 2, "tunables_matmul": 2}


@pytest.mark.parametrize("fixture", sorted(BEFORE))
def test_pairing_of_the_first_fixtures_is_unchanged_or_better(
        fixture: str, capsys: pytest.CaptureFixture[str]) -> None:
    ks = report(fixture, capsys)["kernels"]
    now = {(k["id"], f"{r['file']}:{r['line']}") for k in ks for r in k["references"]}
    assert set(BEFORE[fixture]) <= now
    assert len(ks) >= KERNELS_BEFORE.get(fixture, 1)
    added = now - set(BEFORE[fixture])
    # The only pairs gained are the autograd test's: one per kernel it reaches.
    assert added == ({("include/scale.cuh::fwd::scale_kernel", "tests/test_scale.py:54"),
                      ("include/scale.cuh::bwd::scale_kernel", "tests/test_scale.py:55")}
                     if fixture == "templated_headers" else set())


@pytest.mark.parametrize(("fixture", "pairs"), [
    ("shared_device_fn", {"csrc/activations.cu::gelu_kernel": "tests/test_gelu.py",
                          "csrc/activations.cu::bias_gelu_kernel": "tests/test_bias_gelu.py"}),
    ("naive_elementwise", {"csrc/gelu.cu::gelu_kernel": "tests/test_gelu.py",
                           "csrc/silu.cu::silu_kernel": "tests/test_silu.py"}),
])
def test_ops_of_one_build_pair_with_their_own_tests(
        fixture: str, pairs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    # One extension holds both ops (and in shared_device_fn both kernels call one device
    # function): each kernel is still paired only with the test of its own op.
    ks = kernels(fixture, capsys)
    assert {kid: _reference_files(k) for kid, k in ks.items()} == {
        kid: [test] for kid, test in pairs.items()}
