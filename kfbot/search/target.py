"""The code a candidate's behaviour cell is read from: the target kernel, the kernels a
rewrite derived from it, and the device functions they call.

A file (or an extension) often holds several kernels. Read whole, every candidate of
one of them would show the shared memory of a neighbour and the shuffles of another,
and land in the same cell as the original whatever it changed: the archive would keep
only the fastest of them, and a correct rewrite that is not faster yet (a warp per row
before its loads are vectorised) would never become a parent.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfbot.search.rewrites import syntax as sx


def target_code(sources: Sequence[str], kernel: str) -> list[str]:
    """The text of `kernel` (and of kernels named `<kernel>_kfbot...`) with the device
    functions they call, from each source that defines it; all sources when none does."""
    name = kernel.rsplit("::", 1)[-1]
    out: list[str] = []
    for source in sources:
        if name not in source:
            continue
        root = sx.parse(source)
        kernels = [fn for fn in sx.functions(root) if sx.fn_name(fn) == name
                   or sx.fn_name(fn).startswith(f"{name}_kfbot")]
        if kernels:
            out += [sx.text(sx.definition(fn)) for fn in _with_callees(root, kernels)]
    return out or list(sources)


def _with_callees(root: sx.Node, kernels: list[sx.Node]) -> list[sx.Node]:
    helpers = {sx.fn_name(fn): fn for fn in sx.functions(root, sx.DEVICE_FN)}
    out, todo = list(kernels), list(kernels)
    while todo:
        fn = todo.pop()
        for node in sx.walk(fn):
            if node.type != "call_expression":
                continue
            function = sx.field(node, "function")
            callee = sx.field(function, "name") if function is not None \
                and function.type == "template_function" else function
            found = helpers.get(sx.text(callee)) if callee is not None else None
            if found is not None and found not in out:
                out.append(found)
                todo.append(found)
    return out
