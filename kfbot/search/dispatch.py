"""A size dispatch: the committed candidate where it is faster, the original where it is
slower, chosen in the launcher by a size it is called with.

When the held-out shapes show the candidate slower than the original at some sizes,
it is not committed as it is. If the sizes where it loses are all above (or all below)
those where it holds, the original kernel and launcher are kept beside the candidate
under `<name>_kfbot_orig`, and the candidate's launcher starts with

    if (rows >= 8192) return launch_softmax_kfbot_orig(x, y, rows, cols);

The threshold lies between the sizes (by the geometric mean of the nearest two); which
of the launcher's integer parameters holds the size is not guessed: one dispatch per
parameter is made, and the evaluations at every shape decide. File-scope constants
the candidate changed (a block size `#define`) are written into the original's copy
as the numbers the original had, so the copy is the original.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.evaluation import ShapeTiming
from kfbot.evaluate.inputs.fresh import lead_size
from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.files import cuda_text

SUFFIX = "_kfbot_orig"
_INT_TYPES = frozenset({"int", "int64_t", "long", "longlong", "size_t", "unsigned",
                        "unsignedint", "uint32_t", "uint64_t", "int32_t"})


@dataclass(frozen=True)
class Split:
    """Where the original stays: at sizes `above` the threshold, or at or below it."""

    threshold: int
    above: bool

    def condition(self, name: str) -> str:
        return f"({name}) >= {self.threshold}" if self.above else f"({name}) <= {self.threshold}"


def split_of(timings: Sequence[ShapeTiming]) -> Split | str:
    """The one threshold between the sizes where the candidate is slower and the others,
    or why there is none."""
    slower: list[int] = []
    kept: list[int] = []
    for t in timings:
        lead = _lead(t)
        if lead is None:
            return f"the size of {t.input} is not known"
        (slower if t.speedup.verdict == "slower" else kept).append(lead)
    if not slower:
        return "the candidate is slower nowhere"
    if not kept:
        return "the candidate is slower at every size"
    if min(slower) > max(kept):
        return Split(_between(max(kept), min(slower), up=True), True)
    if max(slower) < min(kept):
        return Split(_between(max(slower), min(kept), up=False), False)
    return ("the sizes where the candidate is slower lie among those where it is faster: "
            "no one threshold separates them")


def _between(low: int, high: int, up: bool) -> int:
    middle = math.isqrt(low * high)
    return max(low + 1, middle) if up else min(high - 1, max(low, middle))


def _lead(t: ShapeTiming) -> int | None:
    if t.signature is None:
        return None
    try:
        return lead_size(CallSignature.from_json(t.signature))
    except (KfbotError, ValueError, KeyError, TypeError):
        return None  # a signature from an older run folder: no size to read


def size_dispatches(files: Mapping[str, str], original: Mapping[str, str], home: str,
                    kernel: str, cand: Candidate, split: Split) -> list[Candidate] | str:
    """One dispatch candidate per integer parameter of the kernel's launcher, or why
    none can be made."""
    new_text, old_text = files.get(home), original.get(home)
    if new_text is None or old_text is None:
        return f"{home} is not an editable file of the candidate"
    new_code, old_code = cuda_text(home, new_text), cuda_text(home, old_text)
    if new_code is None or old_code is None or new_code != new_text:
        return f"{home} is not a CUDA/C++ file kfbot edits as a whole"
    name = kernel.rsplit("::", 1)[-1]
    old_root, new_root = sx.parse(old_code), sx.parse(new_code)
    found = _launcher(old_root, name)
    if isinstance(found, str):
        return found
    launcher, ints = found
    target = [fn for fn in sx.functions(new_root, "(function_definition) @fn")
              if sx.fn_name(fn) == sx.fn_name(launcher)]
    if len(target) != 1 or not ints:
        return (f"the launcher {sx.fn_name(launcher)} is not one function of the candidate "
                "with integer parameters to choose by")
    copy = _original_copy(old_root, new_root, launcher, name)
    out = []
    for param in ints:
        text = _dispatched(new_code, target[0], launcher, copy, split.condition(param))
        if text is not None:
            out.append(Candidate(
                files={**cand.files, home: text}, params=dict(cand.params), origin=cand.origin,
                parent=cand.hash, rationale=f"size dispatch: the original where "
                f"{split.condition(param)}, else {cand.rationale or 'the candidate'}"))
    return out


def _launcher(root: sx.Node, kernel: str) -> tuple[sx.Node, list[str]] | str:
    """The one host function that launches the kernel, and its integer parameters."""
    fns = {id(f): f for launch in sx.launches(root, kernel)
           if (f := sx.enclosing_function(launch)) is not None}
    if len(fns) != 1:
        return f"{kernel} is launched from {len(fns)} functions of its file, not one"
    fn = next(iter(fns.values()))
    ints = [sx.param_name(p) for p in sx.params(fn)
            if "".join(sx.text(sx.field(p, "type")).split()) in _INT_TYPES
            and sx.field(p, "declarator") is not None
            and sx.field(p, "declarator").type == "identifier"]  # type: ignore[union-attr]
    return fn, [i for i in ints if i]


def _original_copy(old_root: sx.Node, new_root: sx.Node, launcher: sx.Node, kernel: str
                   ) -> str:
    """The original kernel and launcher under new names, with the original's values of
    the file's constants the candidate changed."""
    kernels = sx.kernels_named(old_root, kernel)
    parts = [sx.definition(k) for k in kernels] + [sx.definition(launcher)]
    old_consts, new_consts = sx.constants(old_root), sx.constants(new_root)
    changed = {n: v for n, v in old_consts.items() if new_consts.get(n) != v}
    renames = {kernel: kernel + SUFFIX, sx.fn_name(launcher): sx.fn_name(launcher) + SUFFIX,
               **{n: str(v) for n, v in changed.items()}}
    texts = []
    for part in parts:
        base = part.start_byte
        edits = [(n.start_byte - base, n.end_byte - base, renames[sx.text(n)].encode())
                 for n in sx.walk(part) if n.type == "identifier" and sx.text(n) in renames]
        texts.append(sx.splice(sx.text(part).encode(), edits).decode())
    return ("// The original, kept where it is faster (see the size dispatch below).\n"
            + "\n\n".join(texts) + "\n\n")


def _dispatched(code: str, target: sx.Node, launcher: sx.Node, copy: str, condition: str
                ) -> str | None:
    body = sx.field(target, "body")
    if body is None or body.child_count == 0:
        return None
    args = ", ".join(sx.param_name(p) for p in sx.params(target))
    name = sx.fn_name(launcher) + SUFFIX
    returns_void = sx.text(sx.field(target, "type")) == "void"
    call = f"{{ {name}({args}); return; }}" if returns_void else f"return {name}({args});"
    line = f"\n    if ({condition}) {call}  // the original is faster at these sizes"
    opening = body.children[0].end_byte  # just after `{`
    edits: list[sx.Edit] = [(opening, opening, line.encode()),
                            sx.insert_before_definition(target, copy)]
    return sx.splice(code.encode(), edits).decode()
