"""The synthetic repository the scan and hook benchmarks time kfbot on.

CUDA sources with kernels, launchers and pybind11 bindings, plus pytest modules that
load and test the ops; each package also has the layout real packages have: a setup.py
with globbed sources and nvcc flags from a helper, a bindings file, and a wrapper module
its tests call, so that the scan follows calls across modules. A tree is written once
with a manifest beside it (kfbot-bench-manifest.json) and reused while the generator's
version is the same.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = "kfbot-bench-manifest.json"
GENERATOR_VERSION = 3
FILES_PER_FOLDER = 10  # files per innermost folder, so the tree is nested, not flat

# ---- the synthetic repository ---------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One elementwise or row-wise op: a CUDA expression and its PyTorch reference."""

    base: str
    kind: str  # "map": out[i] = f(in[i]); "row": one block per row, shared-memory reduce
    cuda: str  # for "map", an expression in `v`; for "row", the name of the row routine
    reference: str  # PyTorch expression in `x`


OPS = (
    Op("relu", "map", "v > 0.f ? v : 0.f", "torch.relu(x)"),
    Op("gelu", "map", "0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))",
       'torch.nn.functional.gelu(x, approximate="tanh")'),
    Op("silu", "map", "v / (1.f + expf(-v))", "torch.nn.functional.silu(x)"),
    Op("sigmoid", "map", "1.f / (1.f + expf(-v))", "torch.sigmoid(x)"),
    Op("square", "map", "v * v", "x * x"),
    Op("scale", "map", "v * SCALE", "x * 0.5"),
    Op("softmax", "row", "softmax", "torch.softmax(x, dim=-1)"),
    Op("rmsnorm", "row", "rmsnorm", "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)"),
    Op("row_sum", "row", "row_sum", "x.sum(-1, keepdim=True).expand_as(x)"),
)

INCLUDE_SETS = (
    ("<torch/extension.h>", "<ATen/cuda/CUDAContext.h>", "<c10/cuda/CUDAException.h>"),
    ("<torch/types.h>", "<ATen/cuda/CUDAContext.h>", "<cuda_runtime.h>", "<cuda_fp16.h>"),
    ("<torch/extension.h>", "<cuda.h>", "<cuda_runtime.h>", "<c10/cuda/CUDAStream.h>"),
)


@dataclass(frozen=True)
class KernelSpec:
    op: Op
    kernel: str  # the __global__ function's name
    launcher: str  # the host function that launches it (and is bound to Python)
    py_name: str  # the name PYBIND11_MODULE gives it
    templated: bool
    api_launch: bool  # launched with cudaLaunchKernel rather than <<<...>>>


@dataclass(frozen=True)
class CuSpec:
    rel: str  # '/'-separated, relative to the tree root
    package: str
    ext_name: str
    namespace: str  # "" for the global namespace, else "a::b"
    kernels: tuple[KernelSpec, ...]
    binding: bool  # holds a PYBIND11_MODULE


@dataclass
class TreeInfo:
    root: Path
    cu: int
    py: int
    kernels: int
    seed: int
    packages: int
    lines: int = 0
    bytes: int = 0
    generated_s: float | None = None  # None when an existing tree was reused
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> int:
        return self.cu + self.py


def _folder(index: int) -> str:
    return f"g{index // FILES_PER_FOLDER:02d}"


def _place(total: int, packages: int) -> list[tuple[int, int]]:
    """(package, index within package) for each of `total` files, packages filled evenly."""
    per = -(-total // packages) if total else 0
    return [(i // per, i % per) for i in range(total)] if per else []


def plan_cuda(count: int, packages: int, seed: int) -> list[CuSpec]:
    specs: list[CuSpec] = []
    for number, (pkg, idx) in enumerate(_place(count, packages)):
        rng = random.Random(f"{seed}-cu-{number}")
        package = f"pkg{pkg:02d}"
        tag = f"p{pkg:02d}f{idx:03d}"
        namespace = rng.choice(("", "", package, f"{package}::detail", "kernels"))
        kernels = []
        # Op names are unique across the tree: were they shared by unrelated extensions, each
        # test calling `ext.relu` would be linked to every bound `relu`, a different workload.
        for k, op in enumerate(rng.sample(OPS, rng.randint(1, 3))):
            templated = rng.random() < 0.4
            kernels.append(KernelSpec(
                op=op,
                kernel=f"{op.base}_{tag}_{k}_kernel",
                launcher=f"{op.base}_{tag}_{k}_cuda",
                py_name=f"{op.base}_{tag}",
                templated=templated,
                api_launch=not templated and rng.random() < 0.3,
            ))
        specs.append(CuSpec(
            rel=f"{package}/csrc/{_folder(idx)}/{tag}_ops.cu",
            package=package,
            ext_name=f"{package}_{tag}_ext",
            namespace=namespace,
            kernels=tuple(kernels),
            binding=number % 10 == 0,
        ))
    return specs


def _tunables(rng: random.Random) -> list[str]:
    block = rng.choice((128, 256, 512))
    lines = [f"#define BLOCK_SIZE {block}"]
    if rng.random() < 0.5:
        lines += ["#ifndef ITEMS_PER_THREAD", f"#define ITEMS_PER_THREAD {rng.choice((1, 2, 4))}",
                  "#endif"]
    else:
        lines.append(f"constexpr int ITEMS_PER_THREAD = {rng.choice((1, 2, 4))};")
    lines.append(f"constexpr int WARP = {32};")
    lines.append(f"constexpr float SCALE = {rng.choice(('0.5f', '2.0f', '0.125f'))};")
    return lines


def _device_helper(name: str, rng: random.Random) -> list[str]:
    if rng.random() < 0.5:
        return [
            f"__device__ __forceinline__ float {name}(float v) {{",
            "#pragma unroll",
            "  for (int offset = WARP / 2; offset > 0; offset >>= 1) {",
            "    v += __shfl_down_sync(0xffffffff, v, offset);",
            "  }",
            "  return v;",
            "}",
            "",
        ]
    return [
        f"__device__ __forceinline__ float {name}(float a, float b) {{",
        "  // fused multiply-add with a clamp, kept separate so the compiler can inline it",
        "  float r = fmaf(a, b, 0.f);",
        "  r = fminf(fmaxf(r, -65504.f), 65504.f);",
        "  return r;",
        "}",
        "",
    ]


def _kernel_def(spec: KernelSpec) -> list[str]:
    op = spec.op
    t = "scalar_t" if spec.templated else "float"
    idx = "int64_t" if spec.templated else "int"
    head = ["template <typename scalar_t, int BLOCK>"] if spec.templated else []
    bounds = "__launch_bounds__(BLOCK) " if spec.templated else ""
    block = "BLOCK" if spec.templated else "BLOCK_SIZE"
    if op.kind == "map":
        return [
            *head,
            f"__global__ void {bounds}{spec.kernel}({t}* __restrict__ out,",
            f"    const {t}* __restrict__ in, {idx} n) {{",
            f"  const {idx} stride = static_cast<{idx}>(gridDim.x) * {block};",
            f"  for ({idx} i = blockIdx.x * {block} + threadIdx.x; i < n; i += stride) {{",
            "    const float v = static_cast<float>(in[i]);",
            f"    out[i] = static_cast<{t}>({op.cuda});",
            "  }",
            "}",
            "",
        ]
    finish = {
        "softmax": ["    out[base + c] = static_cast<{t}>(expf(x - row_max) / total);"],
        "rmsnorm": ["    out[base + c] = static_cast<{t}>(x * rsqrtf(total / cols + 1e-6f));"],
        "row_sum": ["    out[base + c] = static_cast<{t}>(total);"],
    }[op.cuda]
    first = {
        "softmax": "expf(static_cast<float>(in[base + c]) - row_max)",
        "rmsnorm": "static_cast<float>(in[base + c]) * static_cast<float>(in[base + c])",
        "row_sum": "static_cast<float>(in[base + c])",
    }[op.cuda]
    body = [
        *head,
        f"__global__ void {bounds}{spec.kernel}({t}* __restrict__ out,",
        f"    const {t}* __restrict__ in, {idx} rows, {idx} cols) {{",
        "  extern __shared__ float buf[];",
        f"  const {idx} row = blockIdx.x;",
        "  if (row >= rows) return;",
        f"  const {idx} base = row * cols;",
        "  float row_max = -INFINITY;",
    ]
    if op.cuda == "softmax":
        body += [
            f"  for ({idx} c = threadIdx.x; c < cols; c += {block}) {{",
            "    row_max = fmaxf(row_max, static_cast<float>(in[base + c]));",
            "  }",
            "  buf[threadIdx.x] = row_max;",
            "  __syncthreads();",
            f"  for (int s = {block} / 2; s > 0; s >>= 1) {{",
            "    if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], "
            "buf[threadIdx.x + s]);",
            "    __syncthreads();",
            "  }",
            "  row_max = buf[0];",
            "  __syncthreads();",
        ]
    body += [
        "  float acc = 0.f;",
        f"  for ({idx} c = threadIdx.x; c < cols; c += {block}) {{",
        f"    acc += {first};",
        "  }",
        "  buf[threadIdx.x] = acc;",
        "  __syncthreads();",
        f"  for (int s = {block} / 2; s > 0; s >>= 1) {{",
        "    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];",
        "    __syncthreads();",
        "  }",
        "  const float total = buf[0];",
        f"  for ({idx} c = threadIdx.x; c < cols; c += {block}) {{",
        "    const float x = static_cast<float>(in[base + c]);",
        *(line.format(t=t) for line in finish),
        "  }",
        "}",
        "",
    ]
    return body


def _launcher(spec: KernelSpec) -> list[str]:
    op = spec.op
    row = op.kind == "row"
    lines = [
        f"torch::Tensor {spec.launcher}(torch::Tensor x) {{",
        f'  TORCH_CHECK(x.is_cuda(), "{spec.py_name}: x must be a CUDA tensor");',
        f'  TORCH_CHECK(x.is_contiguous(), "{spec.py_name}: x must be contiguous");',
        "  auto out = torch::empty_like(x);",
    ]
    if row:
        lines += [
            "  const int64_t cols = x.size(-1);",
            "  const int64_t rows = x.numel() / cols;",
            "  const dim3 grid(rows);",
            "  const size_t smem = BLOCK_SIZE * sizeof(float);",
        ]
        tail = "rows, cols"
    else:
        lines += [
            "  const int64_t n = x.numel();",
            "  const dim3 grid((n + BLOCK_SIZE * ITEMS_PER_THREAD - 1) / "
            "(BLOCK_SIZE * ITEMS_PER_THREAD));",
            "  const size_t smem = 0;",
        ]
        tail = "n"
    lines += [
        "  const dim3 block(BLOCK_SIZE);",
        "  cudaStream_t stream = at::cuda::getCurrentCUDAStream();",
    ]
    if spec.templated:
        lines += [
            f'  AT_DISPATCH_FLOATING_TYPES_AND_HALF(x.scalar_type(), "{spec.py_name}", [&] {{',
            f"    {spec.kernel}<scalar_t, BLOCK_SIZE><<<grid, block, smem, stream>>>(",
            f"        out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), {tail});",
            "  });",
        ]
    elif spec.api_launch:
        lines += [
            "  float* out_ptr = out.data_ptr<float>();",
            "  const float* in_ptr = x.data_ptr<float>();",
        ]
        if row:
            lines += ["  int rows_i = static_cast<int>(rows);",
                      "  int cols_i = static_cast<int>(cols);",
                      "  void* args[] = {&out_ptr, &in_ptr, &rows_i, &cols_i};"]
        else:
            lines += ["  int n_i = static_cast<int>(n);",
                      "  void* args[] = {&out_ptr, &in_ptr, &n_i};"]
        lines.append(f"  C10_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>("
                     f"&{spec.kernel}), grid, block, args, smem, stream));")
    else:
        args = "static_cast<int>(rows), static_cast<int>(cols)" if row else "static_cast<int>(n)"
        lines += [
            f"  {spec.kernel}<<<grid, block, smem, stream>>>(",
            f"      out.data_ptr<float>(), x.data_ptr<float>(), {args});",
        ]
    lines += ["  C10_CUDA_KERNEL_LAUNCH_CHECK();", "  return out;", "}", ""]
    return lines


def render_cuda(spec: CuSpec, seed: int, number: int) -> str:
    rng = random.Random(f"{seed}-cu-body-{number}")
    target = rng.randint(60, 200)
    head = [
        f"// {spec.rel}: {', '.join(k.op.base for k in spec.kernels)} for {spec.package}.",
        "// Generated by bench/scan_speed.py; the code is plausible, not meant to be built.",
        "",
        *(f"#include {inc}" for inc in rng.choice(INCLUDE_SETS)),
        f'#include "{rng.choice(("common.cuh", "../utils.cuh", "reduce.cuh"))}"',
        "",
        *_tunables(rng),
        "",
    ]
    opened = [f"namespace {part} {{" for part in spec.namespace.split("::")] \
        if spec.namespace else []
    closed = [f"}}  // namespace {part}" for part in reversed(spec.namespace.split("::"))] \
        if spec.namespace else []
    body: list[str] = []
    for k in spec.kernels:
        body += _kernel_def(k)
    for k in spec.kernels:
        body += _launcher(k)
    binding: list[str] = []
    if spec.binding:
        scope = f"{spec.namespace}::" if spec.namespace else ""
        binding = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
        binding += [f'  m.def("{k.py_name}", &{scope}{k.launcher}, "{k.op.base} (CUDA)");'
                    for k in spec.kernels]
        binding += ["}", ""]
    fixed = len(head) + len(opened) + len(closed) + len(body) + len(binding) + 2
    helpers: list[str] = []
    while fixed + len(helpers) + 8 <= target:
        helpers += _device_helper(f"helper_{len(helpers)}", rng)
    filler = [f"// note {i}: tuned for sm_80; see docs/perf.md" for i in
              range(max(0, target - fixed - len(helpers)))]
    lines = [*head, *opened, "", *helpers, *body, *filler, *closed, "", *binding]
    return "\n".join(lines) + "\n"


SHAPES = ("(7,)", "(1024,)", "(3, 17)", "(64, 256)", "(8, 128, 96)", "(2, 4, 33, 65)")
DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")


def render_python(cu: CuSpec, number: int, seed: int, wrapped: bool = False) -> str:
    """A test module; `wrapped`: it calls the package's wrappers, not `_C` itself."""
    rng = random.Random(f"{seed}-py-{number}")
    target = rng.randint(40, 120)
    lines = [
        f'"""Tests for {cu.package} ops: {", ".join(k.py_name for k in cu.kernels)}."""',
        "",
        "import os",
        "",
        "import pytest",
        "import torch",
    ]
    if cu.binding:
        lines += [
            "from torch.utils.cpp_extension import load",
            "",
            '_REPO = os.path.join(os.path.dirname(__file__), "..", "..", "..")',
            "",
            f'ext = load(name="{cu.ext_name}",',
            f'           sources=[os.path.join(_REPO, "{cu.rel}")],',
            '           extra_cuda_cflags=["-O3", "--use_fast_math"],',
            "           verbose=False)",
        ]
    elif wrapped:
        lines += ["", f"from {cu.package} import ops as ext  # wrappers around _C"]
    else:
        lines += ["", f"from {cu.package} import _C as ext  # built by setup.py"]
    lines += [
        "",
        'pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")',
        "",
        f"SHAPES = [{', '.join(rng.sample(SHAPES, rng.randint(2, 4)))}]",
        f"DTYPES = [{', '.join(rng.sample(DTYPES, rng.randint(1, 3)))}]",
        "",
        "",
    ]
    tests: list[list[str]] = []
    for k in cu.kernels:
        ref = f"reference_{k.py_name}"
        tests.append([
            f"def {ref}(x):",
            f"    return {k.op.reference}",
            "",
            "",
            '@pytest.mark.parametrize("shape", SHAPES)',
            '@pytest.mark.parametrize("dtype", DTYPES)',
            f"def test_{k.py_name}_matches_reference(shape, dtype):",
            "    torch.manual_seed(0)",
            '    x = torch.randn(shape, device="cuda", dtype=dtype)',
            f"    out = ext.{k.py_name}(x)",
            f"    expected = {ref}(x.float()).to(dtype)",
            "    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)",
            "",
            "",
        ])
        if rng.random() < 0.6:
            tests.append([
                f"def test_{k.py_name}_empty():",
                '    x = torch.empty(0, 4, device="cuda")',
                f"    torch.testing.assert_close(ext.{k.py_name}(x), {ref}(x))",
                "",
                "",
            ])
    extra = [
        "def test_rejects_cpu_tensor():",
        "    with pytest.raises(RuntimeError):",
        f"        ext.{cu.kernels[0].py_name}(torch.randn(4))",
        "",
        "",
    ]
    body = [line for test in tests for line in test] + extra
    n = 0
    while len(lines) + len(body) + 7 <= target:
        sizes = ", ".join(str(2 ** rng.randint(3, 14)) for _ in range(2))
        body += [
            f'@pytest.mark.parametrize("n", [{sizes}])',
            f"def test_{cu.kernels[n % len(cu.kernels)].py_name}_sizes_{n}(n):",
            '    x = torch.randn(n, 32, device="cuda")',
            f"    out = ext.{cu.kernels[n % len(cu.kernels)].py_name}(x)",
            f"    torch.testing.assert_close(out, "
            f"reference_{cu.kernels[n % len(cu.kernels)].py_name}(x))",
            "",
            "",
        ]
        n += 1
    lines += body
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) < target:
        lines.append("")
    while len(lines) < target:
        lines.append(f"# case {len(lines)}: keep in sync with docs/testing.md")
    return "\n".join(lines) + "\n"


def render_setup(package: str) -> str:
    """A setup.py as packages write it: globbed sources, the extension class through an
    alias, nvcc flags from a helper that appends in a loop."""
    return "\n".join([
        "import glob",
        "import os",
        "",
        "import torch",
        "from setuptools import setup",
        "from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension",
        "",
        "HERE = os.path.dirname(os.path.abspath(__file__))",
        "",
        "",
        "def nvcc_flags():",
        '    flags = ["-O3", "--use_fast_math", "--expt-relaxed-constexpr"]',
        '    for arch in ("80", "90"):',
        '        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]',
        "    return flags",
        "",
        "",
        "def extensions():",
        "    Ext = CUDAExtension if torch.cuda.is_available() else CppExtension",
        '    sources = sorted(glob.glob(os.path.join(HERE, "csrc", "**", "*.cu"), recursive=True))',
        '    sources += [os.path.join(HERE, "csrc", "bindings.cpp")]',
        f'    return [Ext("{package}._C", sources, extra_compile_args={{"nvcc": nvcc_flags()}})]',
        "",
        "",
        f'setup(name="{package}", ext_modules=extensions(), '
        'cmdclass={"build_ext": BuildExtension})',
        ""])


def render_bindings(specs: list[CuSpec]) -> str:
    """The package's module `_C`: the launchers of its files that bind none themselves."""
    lines = ["#include <torch/extension.h>", ""]
    bound = [(s, k) for s in specs if not s.binding for k in s.kernels]
    for spec, k in bound:
        lines += [f"namespace {spec.namespace} {{" if spec.namespace else "",
                  f"torch::Tensor {k.launcher}(torch::Tensor x);",
                  "}" if spec.namespace else ""]
    lines += ["", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for spec, k in bound:
        scope = f"{spec.namespace}::" if spec.namespace else ""
        lines.append(f'  m.def("{k.py_name}", &{scope}{k.launcher});')
    return "\n".join([*lines, "}", ""])


def render_wrappers(package: str, specs: list[CuSpec]) -> str:
    """The package's Python face: each op through an autograd Function, two calls deep."""
    lines = ["import torch", "", f"from {package} import _C", "", "",
             "class _Op(torch.autograd.Function):", "    @staticmethod",
             "    def forward(ctx, fn, x):", "        return fn(x.contiguous())", "", "",
             "def _run(fn, x):", "    return _Op.apply(fn, x)", ""]
    for spec in specs:
        if spec.binding:
            continue
        for k in spec.kernels:
            lines += ["", f"def {k.py_name}(x):", f"    return _run(_C.{k.py_name}, x)", ""]
    return "\n".join(lines)


def generate(root: Path, cu: int, py: int, packages: int, seed: int) -> TreeInfo:
    started = time.perf_counter()
    packages = max(1, packages)
    # Each package's own files (setup.py, __init__.py, ops.py and csrc/bindings.cpp) come
    # out of the budgets, so the tree holds exactly `cu` + `py` source files.
    layouts = packages if py >= 4 * packages and cu >= 2 * packages else 0
    cu_files, py_files = cu - layouts, py - 3 * layouts
    specs = plan_cuda(cu_files, packages, seed)
    info = TreeInfo(root=root, cu=cu, py=py, kernels=sum(len(s.kernels) for s in specs),
                    seed=seed, packages=packages)

    def write(rel: str, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode()
        path.write_bytes(data)
        info.lines += text.count("\n")
        info.bytes += len(data)

    for number, spec in enumerate(specs):
        write(spec.rel, render_cuda(spec, seed, number))
    for pkg in range(layouts):
        package = f"pkg{pkg:02d}"
        own = [s for s in specs if s.package == package]
        write(f"{package}/setup.py", render_setup(package))
        write(f"{package}/__init__.py", "")
        write(f"{package}/ops.py", render_wrappers(package, own))
        write(f"{package}/csrc/bindings.cpp", render_bindings(own))
    for number, (pkg, idx) in enumerate(_place(py_files, packages)):
        # With no CUDA files asked for, the tests still need some op names to call.
        paired = specs[number % len(specs)] if specs else plan_cuda(1, 1, seed + number)[0]
        module = paired.rel.rsplit("/", 1)[1].removesuffix("_ops.cu")
        write(f"pkg{pkg:02d}/tests/{_folder(idx)}/test_{module}_{idx:03d}.py",
              render_python(paired, number, seed, wrapped=layouts > 0 and number % 2 == 1))
    manifest = {"generator": GENERATOR_VERSION, "cu": cu, "py": py, "kernels": info.kernels,
                "seed": seed, "packages": packages, "lines": info.lines, "bytes": info.bytes}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    info.generated_s = time.perf_counter() - started
    return info


def prepare_tree(args: argparse.Namespace, scratch: Path) -> TreeInfo:
    root = Path(args.tree).resolve() if args.tree else scratch
    manifest = root / MANIFEST
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        info = TreeInfo(root=root, cu=m["cu"], py=m["py"], kernels=m["kernels"], seed=m["seed"],
                        packages=m["packages"], lines=m["lines"], bytes=m["bytes"])
        if m["generator"] != GENERATOR_VERSION:
            info.notes.append(f"{root} was written by generator version {m['generator']}, "
                              f"not {GENERATOR_VERSION}; delete it to regenerate")
        asked = (args.cu, args.py, args.packages, args.seed)
        if asked != (info.cu, info.py, info.packages, info.seed):
            info.notes.append(f"reused {root} as it is: it holds --cu {info.cu} --py {info.py} "
                              f"--packages {info.packages} --seed {info.seed}, not the options "
                              "given (delete it to regenerate)")
        return info
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"scan_speed: {root} exists, is not empty and has no {MANIFEST}; "
                         "refusing to write a tree into it")
    root.mkdir(parents=True, exist_ok=True)
    return generate(root, args.cu, args.py, args.packages, args.seed)
