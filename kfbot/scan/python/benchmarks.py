"""References written for the `kernels` benchmark framework (Hugging Face kernels).

kernels-community repositories often have no tests, only `benchmarks/benchmark.py`:

    class RwkvBenchmark(Benchmark):              # from kernels.benchmark import Benchmark
        def benchmark_base(self):
            self.kernel.forward(self.w, self.u, self.k, self.v, self.out)
        def verify_base(self):
            return rwkv_wkv_reference(self.w, self.u, self.k, self.v)

The framework runs `benchmark_<case>` on the repository's kernel package (`self.kernel`)
and compares its output with what `verify_<case>` returns, raising on a mismatch. Each
such pair is a reference: the op is the package's function, reached at link time from
the package a kernel-builder `build.toml` of the repository makes.
"""

from __future__ import annotations

import ast

from kfbot.scan.model import ReferenceTest
from kfbot.scan.python.scopes import Scope, ScopeIndex
from kfbot.scan.python.syntax import as_written, clip, dotted_name

# Stands for the repository's kernel-builder package in a target path.
KERNEL_PACKAGE = "<kernel>"
_PREFIX = "benchmark_"


def framework_references(index: ScopeIndex) -> list[ReferenceTest]:
    out: list[ReferenceTest] = []
    for cls in index.classes.values():
        if _is_benchmark(cls, index):
            out += _references(cls, index)
    return out


def _is_benchmark(cls: Scope, index: ScopeIndex) -> bool:
    node = cls.node
    if not isinstance(node, ast.ClassDef):
        return False
    for base in node.bases:
        q = index.qualname(base) or ""
        if q.endswith("kernels.benchmark.Benchmark"):
            return True
    return False


def _references(cls: Scope, index: ScopeIndex) -> list[ReferenceTest]:
    out = []
    for name, method in cls.funcs.items():
        if not name.startswith(_PREFIX):
            continue
        verify = cls.funcs.get("verify_" + name[len(_PREFIX):])
        if verify is None or not verify.returns:
            continue
        for call in method.calls:
            op = _kernel_op(call)
            if op is None:
                continue
            reference = clip(as_written(verify.returns[0]), 120)
            test = f"{cls.name}.{name}"
            out.append(ReferenceTest(
                file=index.rel_path, line=call.lineno, test=test, kind="script",
                op=f"self.kernel.{op}", op_name=op, module_hint=None, reference=reference,
                comparison=f"kernels.benchmark ({cls.name}.verify_{name[len(_PREFIX):]})",
                why=f"{test} runs the kernel package's {op} and the framework compares it "
                    f"with {reference}",
                confidence=0.7, target=f"{KERNEL_PACKAGE}.{op}"))
    return out


def _kernel_op(call: ast.Call) -> str | None:
    """`self.kernel.forward(...)` -> "forward"."""
    dotted = dotted_name(call.func) or ""
    parts = dotted.split(".")
    return parts[2] if len(parts) == 3 and parts[:2] == ["self", "kernel"] else None
