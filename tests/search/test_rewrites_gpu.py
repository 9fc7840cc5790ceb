"""Every source rewrite of the library, run on a GPU: for each rewrite, every fixture
kernel it applies to (fixtures/naive_real first, then the other naive fixtures, and the
chains the search makes: a split, then its row cache and float4 loads) is compiled with
nvcc into a small library, called through its own launcher, and compared with PyTorch
on shapes that reach every branch a rewrite adds: a row of one column, tails that are
not a multiple of four (the unaligned, scalar path), rows on both sides of the
warp/block choice (1024 | 1025 columns) and of the shared-memory row cache (2048 |
2049), a row count that is not a multiple of the rows a block takes. Each compiler
setting the flags mutator tries is run the same way on the original.

    pytest -m gpu tests/search/test_rewrites_gpu.py      (about 2 minutes on an H100)

Correctness only; the speedups are measured by bench/search_quality.py --naive.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kfbot.search.mutators.flags import GENES
from kfbot.search.rewrites.registry import SOURCE_REWRITES
from kfbot.search.rewrites.syntax import Target

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ROWS = [(1, 1), (37, 33), (64, 100), (300, 1024), (129, 1025), (17, 2049), (8, 4100)]
IMAGES = [(1, 1), (37, 61), (64, 128), (513, 1030)]
FLAT = [1, 1000, 100003]
MATMULS = [(1, 1, 1), (33, 65, 17), (128, 256, 64), (100, 300, 70)]
Tensor = Any


@dataclass(frozen=True)
class Op:
    """How to call a fixture's launcher and what it must return."""

    params: str  # the C parameter list of the test's entry point
    call: str  # the launcher call with those parameters
    argtypes: tuple[Any, ...]
    run: Callable[[Callable[..., int], Any], tuple[Tensor, Tensor]]  # (kfbot, reference)
    shapes: Sequence[Any]
    rtol: float = 1e-4
    atol: float = 1e-4


def _x(*shape: int) -> Tensor:
    torch.manual_seed(sum(shape))
    return torch.randn(*shape, device="cuda", dtype=torch.float32) * 3.0


def _p(t: Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _rows_op(launcher: str, ref: Callable[[Tensor], Tensor], reduce: bool = False,
             wide: bool = False, **tol: float) -> Op:
    index = "int64_t" if wide else "int"
    ctype = ctypes.c_int64 if wide else ctypes.c_int

    def run(fn: Callable[..., int], shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
        x = _x(*shape)
        y = torch.empty(shape[0] if reduce else shape, device="cuda")
        assert fn(_p(x), _p(y), shape[0], shape[1]) == 0
        return y, ref(x)

    return Op(f"const float* x, float* y, {index} rows, {index} cols",
              f"{launcher}(x, y, rows, cols)",
              (ctypes.c_void_p, ctypes.c_void_p, ctype, ctype), run, ROWS, **tol)


def _norm_op(launcher: str, bias: bool) -> Op:
    def run(fn: Callable[..., int], shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
        x = _x(*shape)
        w = torch.rand(shape[1], device="cuda") + 0.5
        b = torch.randn(shape[1], device="cuda")
        y = torch.empty_like(x)
        if bias:
            assert fn(_p(x), _p(w), _p(b), _p(y), shape[0], shape[1], ctypes.c_float(1e-5)) == 0
            return y, F.layer_norm(x, (shape[1],), w, b, eps=1e-5)
        assert fn(_p(x), _p(w), _p(y), shape[0], shape[1], ctypes.c_float(1e-6)) == 0
        return y, x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * w

    pointers = 4 if bias else 3
    params = ("const float* x, const float* w, const float* b, float* y" if bias
              else "const float* x, const float* w, float* y")
    args = "x, w, b, y" if bias else "x, w, y"
    return Op(f"{params}, int rows, int cols, float eps",
              f"{launcher}({args}, rows, cols, eps)",
              (*[ctypes.c_void_p] * pointers, ctypes.c_int, ctypes.c_int, ctypes.c_float),
              run, ROWS, rtol=1e-4, atol=2e-4)


def _blur_ref(img: Tensor) -> Tensor:
    p = F.pad(img[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
    return 0.2 * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 1:-1] + p[1:-1, 2:])


def _blur(fn: Callable[..., int], shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    x = _x(*shape)
    y = torch.empty_like(x)
    assert fn(_p(x), _p(y), shape[0], shape[1]) == 0
    return y, _blur_ref(x)


def _dropout(fn: Callable[..., int], n: int) -> tuple[Tensor, Tensor]:
    x = _x(n)
    keep = torch.rand(n, device="cuda")
    y = torch.empty_like(x)
    assert fn(_p(x), _p(keep), _p(y), n, ctypes.c_float(0.1)) == 0
    return y, torch.where(keep > 0.1, x / 0.9, torch.zeros_like(x))


def _silu(fn: Callable[..., int], n: int) -> tuple[Tensor, Tensor]:
    x = _x(n)
    y = torch.empty_like(x)
    assert fn(_p(x), _p(y), n) == 0
    return y, F.silu(x)


def _matmul(fn: Callable[..., int], mnk: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    m, n, k = mnk
    a, b = _x(m, k), _x(k, n)
    c = torch.empty(m, n, device="cuda")
    assert fn(_p(a), _p(b), _p(c), m, n, k) == 0
    return c, a @ b


def _transpose(fn: Callable[..., int], shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    x = _x(*shape)
    y = torch.empty(shape[1], shape[0], device="cuda")
    assert fn(_p(x), _p(y), shape[0], shape[1]) == 0
    return y, x.t()


def _softmax(x: Tensor) -> Tensor:
    return torch.softmax(x, dim=-1)


def _gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


INT3 = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
# (fixture, file, kernel) -> how to call it
KERNELS: dict[tuple[str, str, str], Op] = {
    ("naive_real", "csrc/softmax.cu", "softmax_block_kernel"):
        _rows_op("launch_softmax_block", _softmax),
    ("naive_real", "csrc/softmax.cu", "dropout_scale_kernel"): Op(
        "const float* x, const float* keep, float* y, int n, float p",
        "launch_dropout_scale(x, keep, y, n, p)",
        (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_float),
        _dropout, FLAT),
    ("naive_real", "csrc/softmax_warp.cu", "softmax_warp_kernel"):
        _rows_op("launch_softmax_warp", _softmax),
    ("naive_real", "csrc/layernorm.cu", "layernorm_kernel"):
        _norm_op("launch_layernorm", bias=True),
    ("naive_real", "csrc/rmsnorm.cu", "rmsnorm_kernel"): _norm_op("launch_rmsnorm", bias=False),
    ("naive_real", "csrc/reduce.cu", "row_sum_kernel"):
        _rows_op("launch_row_sum<float>", lambda x: x.sum(dim=-1), reduce=True, atol=2e-3),
    ("naive_real", "csrc/reduce.cu", "row_absmax_kernel"):
        _rows_op("launch_row_absmax<float>", lambda x: x.abs().amax(dim=-1), reduce=True),
    ("naive_real", "csrc/stencil.cu", "blur_rows_kernel"): Op(
        "const float* x, float* y, int h, int w", "launch_blur(x, y, h, w)", INT3, _blur,
        IMAGES, rtol=1e-5, atol=1e-5),
    ("naive_rows", "csrc/softmax.cu", "softmax_kernel"):
        _rows_op("launch_softmax", _softmax, wide=True),
    ("naive_rows", "csrc/log_softmax.cu", "log_softmax_kernel"):
        _rows_op("launch_log_softmax", lambda x: torch.log_softmax(x, dim=-1)),
    ("naive_rows", "csrc/row_reduce.cu", "row_max_kernel"):
        _rows_op("launch_row_max", lambda x: x.amax(dim=-1), reduce=True, wide=True),
    ("naive_elementwise", "csrc/gelu.cu", "gelu_kernel"):
        _rows_op("launch_gelu", _gelu, rtol=1e-3, atol=1e-4),
    ("naive_elementwise", "csrc/silu.cu", "silu_kernel"): Op(
        "const float* x, float* y, int n", "launch_silu(x, y, n)",
        (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int), _silu, FLAT, rtol=1e-3),
    ("naive_matmul", "csrc/matmul.cu", "matmul_kernel"): Op(
        "const float* a, const float* b, float* c, int m, int n, int k",
        "launch_matmul(a, b, c, m, n, k)",
        (*[ctypes.c_void_p] * 3, ctypes.c_int, ctypes.c_int, ctypes.c_int), _matmul,
        MATMULS, rtol=1e-3, atol=1e-3),
    ("example", "csrc/matmul.cu", "matmul_kernel"): Op(  # a tiled matmul: fixed-trip loops
        "const float* a, const float* b, float* c, int m, int n, int k",
        "matmul_launch(a, b, c, m, n, k)",
        (*[ctypes.c_void_p] * 3, ctypes.c_int, ctypes.c_int, ctypes.c_int), _matmul,
        MATMULS, rtol=1e-3, atol=1e-3),
    ("naive_transpose", "csrc/transpose.cu", "transpose_kernel"): Op(
        "const float* x, float* y, int rows, int cols", "launch_transpose(x, y, rows, cols)",
        INT3, _transpose, [(1, 1), (33, 65), (512, 1024)], rtol=0.0, atol=0.0),
}
# The chains the search makes on real kernels: a rewrite that applies only to another's
# output is tested on that output.
CHAINS = {
    "online_softmax": ("warp_per_row", "block_per_row"),
    "cache_row_in_shared": ("block_per_row",),
    "vectorize_row_loads": ("warp_per_row", "block_per_row", "row_split_by_length"),
    "warp_shuffle_reduction": (),
}
FAST = {"fast_math_intrinsics"}  # checked at the looser tolerance the rewrite reads


def _source(fixture: str, path: str) -> str:
    return (FIXTURES / fixture / path).read_text()


def _cases(rewrite: str) -> list[tuple[str, tuple[str, str, str], str]]:
    """(case name, kernel key, rewritten source) for every kernel the rewrite fits,
    as written and after each rewrite of its chain."""
    out = []
    for key in KERNELS:
        fixture, path, kernel = key
        starts = [("", _source(fixture, path))]
        for first in CHAINS.get(rewrite, ()):
            made = SOURCE_REWRITES[first](starts[0][1], Target(kernel))
            if made is not None:
                starts.append((f"{first}+", made))
        for prefix, source in starts:
            new = SOURCE_REWRITES[rewrite](source, Target(kernel))
            if new is not None:
                out.append((f"{prefix}{rewrite}@{kernel}", key, new))
    return out


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"-arch=sm_{major}{minor}"


def _build(folder: Path, name: str, source: str, op: Op, flags: Sequence[str] = ()
           ) -> Callable[..., int] | str:
    """The library's entry point, or nvcc's errors."""
    safe = name.replace("@", "_").replace("+", "_")
    src, lib = folder / f"{safe}.cu", folder / f"{safe}.so"
    src.write_text(f"{source}\n\nextern \"C\" int kfbot_test_entry({op.params}) {{\n"
                   f"    return (int){op.call};\n}}\n")
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    proc = subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", _arch(),
                           "-O3", *flags, "-o", str(lib), str(src)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return proc.stderr[-3000:]
    fn = ctypes.CDLL(str(lib)).kfbot_test_entry
    fn.argtypes = list(op.argtypes)
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def _check(fn: Callable[..., int], op: Op, name: str, loose: bool = False) -> None:
    for shape in op.shapes:
        got, want = op.run(fn, shape)
        torch.cuda.synchronize()
        rtol, atol = (max(op.rtol, 1e-3), max(op.atol, 1e-3)) if loose else (op.rtol, op.atol)
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol,
                                   msg=lambda m, s=shape: f"{name} at {s}: {m}")


@pytest.fixture(scope="module", autouse=True)
def _gpu() -> None:
    if not torch.cuda.is_available() or shutil.which("nvcc") is None:
        pytest.skip("needs a CUDA GPU and nvcc")


@pytest.mark.parametrize("rewrite", sorted(SOURCE_REWRITES))
def test_every_output_of_the_rewrite_is_correct(rewrite: str, tmp_path: Path) -> None:
    cases = _cases(rewrite)
    if rewrite not in ("register_tiling_large",):
        assert cases, f"{rewrite} applies to no fixture kernel: nothing would test it"
    with ThreadPoolExecutor(max_workers=8) as pool:
        built = list(pool.map(lambda c: _build(tmp_path, c[0], c[2], KERNELS[c[1]]), cases))
    for (name, key, _), fn in zip(cases, built, strict=True):
        assert not isinstance(fn, str), f"{name} does not compile:\n{fn}"
        _check(fn, KERNELS[key], name, loose=rewrite in FAST)


@pytest.mark.parametrize("option", [o for g in GENES for o in g.options])
def test_each_compiler_setting_keeps_the_results(option: str, tmp_path: Path) -> None:
    for key in [("naive_real", "csrc/layernorm.cu", "layernorm_kernel"),
                ("naive_real", "csrc/softmax.cu", "softmax_block_kernel")]:
        op = KERNELS[key]
        fn = _build(tmp_path, f"{key[2]}{option}", _source(key[0], key[1]), op, (option,))
        assert not isinstance(fn, str), fn
        _check(fn, op, f"{key[2]} with {option}", loose=option == "--use_fast_math")
