"""The mutant that tells whether a test checks a kernel: the kernel writes nothing.

The kernel's body is replaced by an empty one and the extension rebuilt (only the
file that holds the kernel compiles again: the builder caches the rest). The tests
that launched the kernel run again against it, with the allocator's free memory filled
with NaN before each test and each op call (`recorder`), so the outputs the kernel no
longer writes hold NaN, not what an earlier call left there. A test that still passes
does not check the kernel.

Why a rebuild rather than replacing the op's result in Python (as `anticheat.mutants`
does for the adequacy gate): an op may launch several kernels, and a test may reach
the kernel through an op the scan does not know; only the kernel itself made silent
says whether this test notices this kernel. The poison makes the mutant fail loudly
(NaN is never close to anything), and where it cannot reach (an output the test
allocated before the call from memory an earlier result had freed), the mutant can
only pass more often, which errs towards "does not check": never a false reference.

Nothing here runs or imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kfbot.scan import treesitter as tsx
from kfbot.scan.model import Kernel
from kfbot.scan.python.facts import extract_python_facts

SILENT_BODY = "{ /* kfbot mutant: this kernel writes nothing */ }"
_KERNELS = '(function_definition "__global__") @fn'


@dataclass(frozen=True)
class Mutant:
    kernel: str  # the kernel's id
    files: tuple[tuple[str, str], ...]  # (repository path, its text with the kernel silent)


@dataclass(frozen=True)
class NoMutant:
    kernel: str
    reason: str


def silent(root: Path, kernel: Kernel) -> Mutant | NoMutant:
    """The kernel's file with its body emptied, or why that cannot be made."""
    d = kernel.definition
    try:
        text = (root / d.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return NoMutant(kernel.id, f"cannot read {d.file}: {exc}")
    if d.file.endswith(".py"):
        edited = _silent_inline(text, d.file, d.name, d.line)
    else:
        edited = _silent_in(text, d.name, d.line)
    if isinstance(edited, str) and edited.startswith("!"):
        return NoMutant(kernel.id, edited[1:])
    return Mutant(kernel.id, ((d.file, edited),))


def _silent_in(text: str, name: str, line: int, offset: int = 0) -> str:
    """`text` with the body of kernel `name` defined at `line` emptied; "!why" when it
    is not found once."""
    source = text.encode()
    root = tsx.parse_cuda(source).root_node
    found = [m["fn"] for m in tsx.matches(_KERNELS, root) if _name(m["fn"]) == name]
    near = [fn for fn in found if _spans(fn, line - offset)]
    chosen = near or found
    if len(chosen) != 1:
        return f"!kernel {name} found {len(found)} times in its file; cannot silence one"
    body = chosen[0].child_by_field_name("body")
    if body is None:
        return f"!kernel {name} has no body here"
    return (source[:body.start_byte] + SILENT_BODY.encode() + source[body.end_byte:]).decode()


def _name(fn: tsx.Node) -> str:
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    name = decl.child_by_field_name("declarator") if decl is not None else None
    return tsx.text(name).rsplit("::", 1)[-1]


def _spans(fn: tsx.Node, line: int) -> bool:
    top = fn
    while top.parent is not None and top.parent.type == "template_declaration":
        top = top.parent
    return top.start_point[0] + 1 <= line <= fn.end_point[0] + 1


def _silent_inline(text: str, file: str, name: str, line: int) -> str:
    """A kernel in a Python string (load_inline): the string's text emptied of the
    kernel's body, put back where it stands in the file."""
    facts = extract_python_facts(file, text.encode())
    for source in facts.inline_sources:
        if source.text is None or source.language != "cuda":
            continue
        lines = source.text.count("\n") + 1
        if not source.line_offset < line <= source.line_offset + lines:
            continue
        edited = _silent_in(source.text, name, line, source.line_offset)
        if edited.startswith("!"):
            return edited
        if text.count(source.text) != 1:
            return (f"!the source of {name} in {file} is not written literally once "
                    "(escapes or concatenation): cannot place the mutant")
        return text.replace(source.text, edited)
    return f"!no inline CUDA source of {file} holds line {line}"
