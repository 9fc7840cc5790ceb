"""Facts from one Python file: extension builds, inline CUDA sources and reference tests.

Everything is read statically with `ast`; torch is never imported. A build is a call to
`CUDAExtension`/`CppExtension`/`load`/`load_inline`. A reference test is a scope that calls
a bound op and compares its result with a pure-PyTorch computation. Names are followed
through simple assignments, loops, `pytest.mark.parametrize` and fixtures of the same file;
what cannot be read statically is kept as written and noted as an info Problem.

The work is shared by the modules of this package: `scopes` indexes the file,
`values` evaluates expressions and paths, `builds` and `inline` read builds,
`ops` finds calls into extensions, `compare`, `inputs` and `references`
find the reference tests and `modules` summarises what the file offers to files that
import it (`syntax` holds small helpers on syntax nodes). This module wires them
together for one file.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Callable

from kfbot.scan.model import BuildRecipe, Problem, PyFileFacts
from kfbot.scan.python.benchmarks import framework_references
from kfbot.scan.python.builds import BuildReader
from kfbot.scan.python.compare import CompareFinder
from kfbot.scan.python.flow import import_effects
from kfbot.scan.python.inline import InlineReader
from kfbot.scan.python.inputs import InputReader
from kfbot.scan.python.modules import Paths, SymbolReader
from kfbot.scan.python.ops import OpFinder
from kfbot.scan.python.references import ReferenceFinder
from kfbot.scan.python.scopes import ScopeIndex
from kfbot.scan.python.values import Evaluator

# A file with none of these can hold neither a build nor a comparison this module
# recognises (a bare `load` comes from `cpp_extension`); skipping it without parsing
# keeps the scan fast on large repositories.
# Files that import torch are read too, so that a syntax error in one is reported.
_RELEVANT = re.compile(
    rb"CUDAExtension|CppExtension|load_inline|cpp_extension|assert_close|allclose|equal\(|abs\("
    rb"|import torch|from torch|kernels.benchmark")


def extract_python_facts(rel_path: str, source: bytes,
                         exists: Callable[[str], bool] | None = None) -> PyFileFacts:
    """Builds, inline sources, reference tests and symbols of one Python file; never
    raises.

    `rel_path` is the file's '/'-separated path under the repository root; `exists(rel)`
    says whether a repo-relative path exists (None: assume source paths exist).
    """
    if not _RELEVANT.search(source) and is_test_module(rel_path):
        return PyFileFacts(file=rel_path)  # nothing imports a test module
    tree = _parse(rel_path, source)
    if isinstance(tree, Problem):
        return PyFileFacts(file=rel_path, problems=(tree,))
    analysis: _File | None = None
    try:
        analysis = _File(rel_path, tree, exists)
        return analysis.facts()
    except Exception as exc:  # one odd file must not stop a scan of thousands
        message = f"Python file could not be analysed ({type(exc).__name__}: {exc})"
        return PyFileFacts(file=rel_path, problems=(Problem(rel_path, None, message),))
    finally:
        if analysis is not None:
            analysis.release()


def _parse(rel_path: str, source: bytes) -> ast.Module | Problem:
    """`ast.parse` on the bytes, so a PEP 263 coding line is honoured."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in strings are not our concern
            return ast.parse(source, filename=rel_path)
    except SyntaxError as exc:
        if "codec can't decode" in str(exc.msg):
            return Problem(rel_path, None, f"Python file cannot be decoded: {exc.msg}")
        return Problem(rel_path, exc.lineno, f"Python syntax error: {exc.msg}")
    except ValueError as exc:  # UnicodeDecodeError and NUL bytes on older Pythons
        return Problem(rel_path, None, f"Python file cannot be decoded: {exc}")
    except (RecursionError, MemoryError):
        return Problem(rel_path, None, "Python file is too deeply nested to parse")


class _File:
    """The readers of one file, each handed the ones it builds on."""

    def __init__(self, rel_path: str, tree: ast.Module,
                 exists: Callable[[str], bool] | None) -> None:
        self.index = ScopeIndex(rel_path, tree)
        self.values = Evaluator(self.index, exists)
        self.builds = BuildReader(self.index, self.values, InlineReader(self.index, self.values))
        self.paths = Paths(self.index, self.values, self.builds,
                           summarised=not is_test_module(rel_path))
        self.ops = OpFinder(self.index, self.values, self.builds, exists, self.paths)
        self.compares = CompareFinder(self.index)
        self.references = ReferenceFinder(self.index, self.ops, self.compares,
                                          InputReader(self.index, self.values))

    def facts(self) -> PyFileFacts:
        builds, inline = self.builds.read()  # first: ops are resolved through build names
        references = self.references.find() + framework_references(self.index)
        symbols = () if is_test_module(self.index.rel_path) else tuple(
            SymbolReader(self.index, self.paths, self.builds, self.compares).read())
        problems = tuple(dict.fromkeys([*self.values.problems, *self._effects(builds)]))
        return PyFileFacts(file=self.index.rel_path, builds=tuple(builds),
                           inline_sources=tuple(inline), references=tuple(references),
                           problems=problems, symbols=symbols)

    def _effects(self, builds: list[BuildRecipe]) -> list[Problem]:
        """A setup script that runs commands when it is run: never by the scan."""
        if not any(b.kind == "setup_py" for b in builds):
            return []
        return [Problem(self.index.rel_path, line, f"running this file runs `{call}`; the "
                        "scan reads it without running it, so what that computes (a "
                        "version, a flag) cannot be told") for line, call in
                import_effects(self.index)]

    def release(self) -> None:
        """Free what the file's analysis holds; see `ScopeIndex.release`."""
        self.index.release()
        self.ops.release()


def is_test_module(rel_path: str) -> bool:
    """A pytest module (`test_*.py`, `*_test.py`): what it defines is imported by none."""
    base = rel_path.rsplit("/", 1)[-1]
    return base.startswith("test_") or base.endswith("_test.py") or base in ("test.py",
                                                                             "tests.py")
