"""The profiler's kernel names, read, and matched to the kernels the scan found.

torch's profiler gives each CUDA kernel its demangled name, as the compiler's symbol
says it (measured with PyTorch 2.11, CUDA 13):

    void ops::detail::scale_kernel<float, 128>(float const*, float*, int, float)
    plain_c_kernel                                            (extern "C")
    free_kernel(float*, int)                                  (a plain C++ function)
    void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, ...>(float*, ...)

`parse` takes one apart (return type, namespace, name, template arguments, parameter
types); `match` finds the scanned definitions it can be: same name, same namespace
(anonymous namespaces aside, which the scan does not name), as many template
arguments as the definition has template parameters, as many parameters; and where
that still leaves several (one kernel copied into two extensions), the one whose build
the test had loaded.

This module runs in kfbot's own process: no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kfbot.evaluate.build.symbols import split_top
from kfbot.scan.model import Kernel

ANONYMOUS = "(anonymous namespace)"
_ANON_MARK = "\0anon\0"
# A namespace component written as a macro the scan could not resolve (`KFOPS_NS`).
_MACRO = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class KernelName:
    """A demangled kernel name, taken apart."""

    name: str
    namespace: tuple[str, ...] = ()  # outermost first; anonymous ones as ANONYMOUS
    template_args: tuple[str, ...] = ()
    params: tuple[str, ...] | None = None  # None: the name gives none (extern "C")
    templated: bool = False  # written with <...>, even if empty

    @property
    def qualified(self) -> str:
        return "::".join((*self.namespace, self.name))


def parse(text: str) -> KernelName:
    """`void a::b::k<float, 128>(float const*, int)` -> name k, namespace (a, b),
    template args (float, 128), params (float const*, int). Never raises: a name it
    cannot read comes back whole as the name."""
    work = text.strip().replace(ANONYMOUS, _ANON_MARK)
    head, params = _split_params(work)
    head = _drop_return_type(head)
    parts = _split_top(head, "::")
    last = parts[-1] if parts else head
    name, targs, templated = _split_template(last)
    namespace = tuple(p.replace(_ANON_MARK, ANONYMOUS) for p in parts[:-1])
    return KernelName(name.replace(_ANON_MARK, ANONYMOUS).strip(), namespace,
                      tuple(a.replace(_ANON_MARK, ANONYMOUS) for a in targs),
                      params, templated)


def _split_params(text: str) -> tuple[str, tuple[str, ...] | None]:
    """The name before the top-level parameter list at the end, and the parameters."""
    if not text.endswith(")"):
        return text, None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c in ")>":
            depth += 1
        elif c in "(<":
            depth -= 1
            if depth == 0 and c == "(":
                inner = text[i + 1:-1].strip()
                params = () if inner in ("", "void") else tuple(
                    p.strip() for p in _split_top(inner, ","))
                return text[:i].rstrip(), params
    return text, None


def _drop_return_type(head: str) -> str:
    """`void ns::k<int, 2>` -> `ns::k<int, 2>`: the last top-level word."""
    words = _split_top(head, " ")
    return words[-1] if words else head


def _split_template(last: str) -> tuple[str, tuple[str, ...], bool]:
    at = last.find("<")
    if at <= 0 or not last.endswith(">"):
        return last, (), False
    inner = last[at + 1:-1].strip()
    args = tuple(a.strip() for a in _split_top(inner, ",")) if inner else ()
    return last[:at], args, True


def _split_top(text: str, sep: str) -> list[str]:
    """The stripped, non-empty parts of `text` split at `sep` where no <>, () or [] is
    open."""
    return [p for p in (x.strip() for x in split_top(text, sep)) if p]


# --- matching ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """The scanned kernels a launched name can be; `by_library` when the loaded
    libraries chose among several."""

    name: str
    kernels: tuple[Kernel, ...]
    by_library: bool = False

    @property
    def ambiguous(self) -> bool:
        return len(self.kernels) > 1


def match(text: str, kernels: Sequence[Kernel], libraries: Iterable[str] = ()) -> Match:
    """The scanned kernels the profiler's `text` names; `libraries`: the names (module
    names, file names) of the extensions the test had loaded."""
    found = parse(text)
    fits = [k for k in kernels if _fits(found, k)]
    if len(fits) > 1:
        loaded = {_stem(x) for x in libraries}
        chosen = [k for k in fits if any(_stem(b.name) in loaded for b in k.builds)]
        if chosen and len(chosen) < len(fits):
            return Match(text, tuple(chosen), by_library=True)
    return Match(text, tuple(fits))


def _fits(found: KernelName, kernel: Kernel) -> bool:
    d = kernel.definition
    if found.name != d.name:
        return False
    if found.params is None:  # extern "C": the symbol is the bare name, in any namespace
        return not found.namespace and not found.templated and not d.template_params \
            and (d.extern_c or not d.namespace)
    if d.extern_c or not _same_namespace(found.namespace, d.namespace):
        return False
    if bool(d.template_params) != found.templated:
        return False
    variadic = _variadic(kernel)
    if d.template_params and len(found.template_args) != len(d.template_params) \
            and not variadic:
        return False
    return len(found.params) == len(d.params) or variadic


def _same_namespace(found: tuple[str, ...], scanned: str) -> bool:
    named = [p for p in found if p != ANONYMOUS]
    written = [p for p in scanned.split("::") if p]
    if len(named) != len(written):
        return False
    return all(a == b or _MACRO.match(b) for a, b in zip(named, written, strict=True))


def _variadic(kernel: Kernel) -> bool:
    d = kernel.definition
    return any("..." in (p.type or "") or "..." in p.name for p in d.params) or any(
        "..." in (t.type or "") or "..." in t.name for t in d.template_params)


def _stem(name: str) -> str:
    """A library's name as builds name it: `obs_ext` for `obs_ext.cpython-312-x86_64.so`,
    `libkfops.so` or `obs_ext`."""
    base = name.rsplit("/", 1)[-1].split(".", 1)[0]
    return base.removeprefix("lib")
