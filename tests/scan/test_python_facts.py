"""The Python extractor on small sources: builds and inline sources, and bad input
(reference tests: test_python_references.py)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from kfbot.scan.model import BuildRecipe, InlineSource, PyFileFacts
from kfbot.scan.python.facts import extract_python_facts


def _facts(source: str, path: str = "pkg/mod.py",
           files: Iterable[str] | None = None) -> PyFileFacts:
    present = set(files) if files is not None else None
    exists = (lambda rel: rel in present) if present is not None else None
    return extract_python_facts(path, source.encode(), exists)


def _build(facts: PyFileFacts, name: str) -> BuildRecipe:
    (found,) = [b for b in facts.builds if b.name == name]
    return found


def _infos(facts: PyFileFacts) -> list[str]:
    return [p.message for p in facts.problems if p.severity == "info"]


def _assert_lines_map(source: str, inline: InlineSource) -> None:
    """Line k of the inline text is line line_offset + k of the file."""
    assert inline.text is not None
    file_lines = source.splitlines()
    for k, line in enumerate(inline.text.splitlines(), start=1):
        assert line in file_lines[inline.line_offset + k - 1], (k, line)


# --- setup.py ----------------------------------------------------------------------

SETUP_PY = """\
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension, CppExtension
import torch.utils.cpp_extension as ce

this_dir = os.path.dirname(os.path.abspath(__file__))
common = ["-O3"]
setup(
    name="pkg",
    ext_modules=[
        CUDAExtension(
            "pkg._C",
            [os.path.join(this_dir, "csrc", "a.cu"), "csrc/b.cpp", "top.cu"],
            extra_compile_args={"cxx": common + ["-DFOO"],
                                "nvcc": ["-O3", "-DTILE=16", "-D", "BAR=2"]},
            define_macros=[("WITH_CUDA", None), ("X", "1")],
        ),
        CppExtension(name="pkg._cpu", sources=["csrc/cpu.cpp"], extra_compile_args=["-O2"]),
        ce.CUDAExtension(name="pkg._E",
                         sources=[os.path.join(this_dir, "csrc", f) for f in ("x.cu", "y.cu")]),
    ],
    cmdclass={"build_ext": BuildExtension},
)
"""
SETUP_FILES = {"ext/csrc/a.cu", "ext/csrc/b.cpp", "top.cu", "ext/csrc/cpu.cpp",
               "ext/csrc/x.cu", "ext/csrc/y.cu"}


def test_cuda_extension_positional_with_flag_dict_and_macros() -> None:
    facts = _facts(SETUP_PY, "ext/setup.py", SETUP_FILES)
    b = _build(facts, "pkg._C")
    assert (b.kind, b.file, b.line, b.inline, b.variable) == (
        "setup_py", "ext/setup.py", 11, False, None)
    # next to setup.py first; `top.cu` only exists at the repository root
    assert b.sources == ("ext/csrc/a.cu", "ext/csrc/b.cpp", "top.cu")
    assert b.extra_cflags == ("-O3", "-DFOO")
    assert b.extra_cuda_cflags == ("-O3", "-DTILE=16", "-D", "BAR=2")
    assert b.defines == (("WITH_CUDA", ""), ("X", "1"), ("FOO", ""), ("TILE", "16"),
                         ("BAR", "2"))
    assert facts.problems == ()


def test_cpp_extension_keywords_and_qualified_call() -> None:
    facts = _facts(SETUP_PY, "ext/setup.py", SETUP_FILES)
    cpu = _build(facts, "pkg._cpu")
    assert (cpu.kind, cpu.sources, cpu.extra_cflags, cpu.extra_cuda_cflags) == (
        "setup_py", ("ext/csrc/cpu.cpp",), ("-O2",), ())
    comprehension = _build(facts, "pkg._E")
    assert comprehension.sources == ("ext/csrc/x.cu", "ext/csrc/y.cu")
    assert [b.name for b in facts.builds] == ["pkg._C", "pkg._cpu", "pkg._E"]


def test_missing_glob_and_dynamic_sources_are_info_problems() -> None:
    source = """\
import glob, os
from torch.utils.cpp_extension import CUDAExtension
here = os.path.dirname(__file__)
CUDAExtension("a", glob.glob(os.path.join(here, "csrc", "*.cu")))
CUDAExtension("b", ["gone.cu", find_sources()])
"""
    facts = _facts(source, "ext/setup.py", {"ext/setup.py"})
    assert _build(facts, "a").sources == ("ext/csrc/*.cu",)
    assert _build(facts, "b").sources == ("ext/gone.cu", "find_sources()")
    assert all(p.severity == "info" for p in facts.problems)
    messages = _infos(facts)  # the glob is matched against the repository's files later
    assert any("'gone.cu' not found" in m for m in messages)
    assert any("find_sources()" in m and "not a static path" in m for m in messages)


# --- load() --------------------------------------------------------------------------

LOAD_PY = """\
import os
from pathlib import Path
from torch.utils import cpp_extension

_DIR = Path(__file__).parent
_SRC = os.path.join(_DIR, "csrc")
_ext = None


def get_ext():
    global _ext
    if _ext is None:
        _ext = cpp_extension.load(
            name="my_ext",
            sources=[os.path.join(_SRC, "k.cu"), _DIR / ".." / "shared" / "s.cpp"],
            extra_cflags=["-O2"],
            extra_cuda_cflags=["-O3", "-DBLOCK=128", "--use_fast_math"],
        )
    return _ext


def _load():
    return cpp_extension.load("other", [f"{_DIR}/csrc/o.cu"])


OTHER = _load()
direct = cpp_extension.load(name="direct", sources=["csrc/k.cu"])
"""


def test_load_resolves_file_relative_paths_and_flags() -> None:
    facts = _facts(LOAD_PY, "pkg/ops.py")
    b = _build(facts, "my_ext")
    assert (b.kind, b.line, b.variable) == ("load", 13, "_ext")
    assert b.sources == ("pkg/csrc/k.cu", "shared/s.cpp")
    assert (b.extra_cflags, b.extra_cuda_cflags) == (
        ("-O2",), ("-O3", "-DBLOCK=128", "--use_fast_math"))
    assert b.defines == (("BLOCK", "128"),)
    assert facts.problems == ()


def test_load_variable_from_factory_and_assignment() -> None:
    facts = _facts(LOAD_PY, "pkg/ops.py")
    other, direct = _build(facts, "other"), _build(facts, "direct")
    assert (other.variable, other.sources) == ("OTHER", ("pkg/csrc/o.cu",))
    assert (direct.variable, direct.sources) == ("direct", ("pkg/csrc/k.cu",))


def test_load_falls_back_to_repo_root_then_reports_missing() -> None:
    source = "from torch.utils.cpp_extension import load\n" \
             "ext = load('x', ['csrc/k.cu'])\n"
    assert _build(_facts(source, "tools/b.py", {"csrc/k.cu"}), "x").sources == ("csrc/k.cu",)
    assert _build(_facts(source, "tools/b.py", {"tools/csrc/k.cu", "csrc/k.cu"}),
                  "x").sources == ("tools/csrc/k.cu",)
    missing = _facts(source, "tools/b.py", set())
    assert _build(missing, "x").sources == ("tools/csrc/k.cu",)
    assert [(p.line, p.severity) for p in missing.problems] == [(2, "info")]


def test_star_imported_and_re_exported_load() -> None:
    source = "from torch.utils.cpp_extension import *\next = load('star', ['a.cu'])\n" \
             "from .jit import load as jit_load\n" \
             "other = jit_load(name='wrapped', sources=['b.cu'])\n"
    facts = _facts(source, "m.py")
    assert [(b.kind, b.name, b.sources, b.variable) for b in facts.builds] == [
        ("load", "star", ("a.cu",), "ext"), ("load", "wrapped", ("b.cu",), "other")]


def test_json_load_and_torch_load_are_not_builds() -> None:
    source = "import json, torch\nassert json.load(f)\nw = torch.load('w.pt')\n" \
             "from torch.utils.cpp_extension import load_inline\n"
    assert _facts(source).builds == ()


# --- load_inline() ---------------------------------------------------------------------

INLINE_PY = '''\
import textwrap
from pathlib import Path
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor scale(torch::Tensor x);"
SAME_LINE = """__global__ void same_line(float* x) {
  x[0] = 1;
}
"""
NEXT_LINE = """
__global__ void next_line(float* x) {
  x[0] = 2;
}
"""
TILE = 16
FSTR = f"""
#define TILE {TILE}
__global__ void templated() {{}}
"""
DEDENTED = textwrap.dedent("""
    __global__ void dedented(float* x) {
      x[0] = 3;
    }
""").strip()
JOINED = "__global__ void j1() {}\\n" + \\
    "__global__ void j2() {}\\n"
FROM_FILE = Path(__file__).parent.joinpath("kernels", "from_file.cu").read_text()


def build():
    with open("kernels/with_open.cu") as f:
        opened = f.read()
    return load_inline(
        name="scale_inline",
        cpp_sources=CPP,
        cuda_sources=[SAME_LINE, NEXT_LINE, FSTR, DEDENTED, JOINED, FROM_FILE, opened,
                      open("kernels/direct.cu").read()],
        functions="scale",
        extra_cuda_cflags=["-DVEC=4"],
    )


ext = load_inline("literal", cpp_sources="", cuda_sources="__global__ void lit() {}",
                  functions=["a", "b"])
'''


def _inline(facts: PyFileFacts, build: str) -> list[InlineSource]:
    return [s for s in facts.inline_sources if s.build == build]


def test_load_inline_recipe() -> None:
    facts = _facts(INLINE_PY, "demo/inline.py")
    b = _build(facts, "scale_inline")
    assert (b.kind, b.inline, b.functions, b.variable) == (
        "load_inline", True, ("scale",), None)
    assert b.sources == ("demo/kernels/from_file.cu", "demo/kernels/with_open.cu",
                         "demo/kernels/direct.cu")
    assert (b.extra_cuda_cflags, b.defines) == (("-DVEC=4",), (("VEC", "4"),))
    literal = _build(facts, "literal")
    assert (literal.functions, literal.variable, literal.sources) == (("a", "b"), "ext", ())
    assert facts.problems == ()


def test_inline_text_starting_on_the_quote_line_maps_exactly() -> None:
    facts = _facts(INLINE_PY, "demo/inline.py")
    sources = _inline(facts, "scale_inline")
    same = next(s for s in sources if s.text and "same_line" in s.text)
    assert (same.language, same.line_offset, same.path) == ("cuda", 5, None)
    assert same.text is not None
    assert INLINE_PY.splitlines()[same.line_offset].endswith(same.text.splitlines()[0])
    _assert_lines_map(INLINE_PY, same)


def test_inline_text_starting_on_the_next_line_maps_exactly() -> None:
    facts = _facts(INLINE_PY, "demo/inline.py")
    nxt = next(s for s in _inline(facts, "scale_inline") if s.text and "next_line" in s.text)
    assert nxt.line_offset == 9
    assert nxt.text is not None and nxt.text.startswith("\n__global__ void next_line")
    assert INLINE_PY.splitlines()[nxt.line_offset + 1] == "__global__ void next_line(float* x) {"
    _assert_lines_map(INLINE_PY, nxt)


def test_inline_fstring_dedent_strip_and_concatenation() -> None:
    facts = _facts(INLINE_PY, "demo/inline.py")
    texts = {s.text: s for s in _inline(facts, "scale_inline") if s.text}
    fstr = next(s for t, s in texts.items() if "templated" in t)
    assert fstr.text == "\n#define TILE 16\n__global__ void templated() {}\n"
    assert fstr.line_offset == 15
    dedented = next(s for t, s in texts.items() if "dedented" in t)
    # .strip() removed the leading newline, so the text starts one line lower
    assert dedented.text == "__global__ void dedented(float* x) {\n  x[0] = 3;\n}"
    assert dedented.line_offset == 20
    joined = next(s for t, s in texts.items() if "j1" in t)
    assert joined.text == "__global__ void j1() {}\n__global__ void j2() {}\n"
    for s in (dedented, joined):
        _assert_lines_map(INLINE_PY, s)


def test_inline_cpp_and_file_reads() -> None:
    facts = _facts(INLINE_PY, "demo/inline.py")
    sources = _inline(facts, "scale_inline")
    (cpp,) = [s for s in sources if s.language == "cpp"]
    assert (cpp.text, cpp.line_offset) == ("torch::Tensor scale(torch::Tensor x);", 4)
    reads = [(s.language, s.text, s.line_offset, s.path) for s in sources if s.path]
    assert reads == [("cuda", None, 0, "demo/kernels/from_file.cu"),
                     ("cuda", None, 0, "demo/kernels/with_open.cu"),
                     ("cuda", None, 0, "demo/kernels/direct.cu")]
    assert [s.text for s in _inline(facts, "literal")] == ["__global__ void lit() {}"]


def test_inline_backslash_opening_and_implicit_concatenation() -> None:
    source = 'from torch.utils.cpp_extension import load_inline\nA = """\\\n' \
             '__global__ void a() {}\n"""\nB = ("__global__ void b1() {}\\n"\n' \
             '     "__global__ void b2() {}\\n")\n' \
             'load_inline("n", cpp_sources="", cuda_sources=[A, B])\n'
    a, b = _facts(source).inline_sources
    assert (a.text, a.line_offset) == ("__global__ void a() {}\n", 2)
    assert b.line_offset == 4
    _assert_lines_map(source, a)
    _assert_lines_map(source, b)


def test_literals_joined_on_one_line_stay_apart() -> None:
    # Joined, "void b" would claim the line after the one it is written on.
    source = 'from torch.utils.cpp_extension import load_inline\n' \
             'S = "void a();\\n" + "void b();\\n"\n' \
             'load_inline("n", cpp_sources=S)\n'
    assert [(s.text, s.line_offset) for s in _facts(source).inline_sources] == [
        ("void a();\n", 1), ("void b();\n", 1)]


def test_unresolvable_inline_source_is_an_info_problem() -> None:
    source = """\
from torch.utils.cpp_extension import load_inline
def build(src):
    return load_inline(name="dyn", cpp_sources="", cuda_sources=src)
"""
    facts = _facts(source)
    assert _build(facts, "dyn").sources == ()
    assert facts.inline_sources == ()
    assert [(p.line, p.severity) for p in facts.problems] == [(3, "info")]
    assert "cuda source `src`" in facts.problems[0].message


# --- bad input -------------------------------------------------------------------------


def test_syntax_error_is_one_warning() -> None:
    facts = _facts("import torch\ndef f(:\n    assert torch.allclose(a, b)\n")
    assert (facts.builds, facts.references) == ((), ())
    (problem,) = facts.problems
    assert (problem.file, problem.line, problem.severity) == ("pkg/mod.py", 2, "warning")
    assert problem.message.startswith("Python syntax error: ")


def test_undecodable_bytes_are_one_warning() -> None:
    facts = extract_python_facts("t.py", b"x = 1\nassert torch.allclose(a, '\xff\xfe')\n")
    (problem,) = facts.problems
    assert (problem.severity, problem.line) == ("warning", None)
    assert "decode" in problem.message


def test_declared_coding_is_honoured() -> None:
    source = b"# -*- coding: latin-1 -*-\nimport torch, kern\nassert torch.allclose(" \
             b"kern.f(torch.ones(2)), torch.ones(2))  # caf\xe9\n"
    facts = extract_python_facts("t.py", source)
    assert facts.problems == ()
    assert [(r.test, r.op) for r in facts.references] == [("<module>", "kern.f")]


def test_test_modules_without_relevant_tokens_are_not_parsed() -> None:
    # The syntax error goes unreported: nothing here could be a build or a comparison,
    # and nothing imports a test module.
    assert extract_python_facts("tests/test_m.py", b"def f(:\n    return 1\n") == \
        PyFileFacts(file="tests/test_m.py")
    # A library module is read for what it offers to the modules that import it.
    facts = extract_python_facts("pkg/m.py", b"from pkg._impl import run\ndef f(x):\n"
                                              b"    return run(x)\n")
    assert [(s.name, s.kind, s.targets) for s in facts.symbols] == [
        ("run", "import", (("pkg._impl.run", 1),)), ("f", "function", (("pkg._impl.run", 3),))]


@pytest.mark.parametrize("source", [SETUP_PY, LOAD_PY, INLINE_PY])
def test_truncated_sources_never_raise(source: str) -> None:
    data = source.encode()
    for end in range(0, len(data), 7):
        facts = extract_python_facts("tests/test_cut.py", data[:end], lambda rel: False)
        assert not [p for p in facts.problems if "could not be analysed" in p.message]


def test_importorskip_binds_an_extension_module() -> None:
    facts = _facts("""\
import pytest
import torch

def test_rowsum():
    rowsum_ext = pytest.importorskip("rowsum_ext")
    x = torch.randn(7, 33, device="cuda")
    torch.testing.assert_close(rowsum_ext.rowsum(x), x.sum(dim=1))
""", path="tests/test_rowsum.py")
    (ref,) = facts.references
    assert (ref.op, ref.op_name, ref.module_hint, ref.reference) == (
        "rowsum_ext.rowsum", "rowsum", "rowsum_ext", "x.sum(dim=1)")
    assert ref.confidence == 0.9
