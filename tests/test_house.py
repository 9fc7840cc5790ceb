"""The shape of the house: kfbot's imports, read with `ast`, point one way.

Every import counts, at module level, inside a function or under `TYPE_CHECKING`: an
arrow a reader follows is an arrow whether or not it runs at import time. Importing a
submodule runs its package's `__init__` too, but that arrow is the language's, not the
code's, so it is not counted; a module that imports its own package's facade is.

The rules, each failing with the import lines to change:
- no circle of modules (a strongly connected component of more than one module);
- the floors (`FLOORS`) import downwards only, so no package-level cycle either;
- inside every package, its sub-packages import one way: no cycle among siblings
  (`evaluate.capture` -> `evaluate.build` -> `evaluate.capture` is one), and where an
  order is declared (`SUB_FLOORS`), downwards in that order;
- every package's `__init__` docstring says what it owns and what it may import;
- no module over `MAX_LINES` lines: split by concern before crossing it;
- the tests mirror the floors: each folder of `tests/` is named after one, and a test
  file's name is unique across them.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

KFBOT = Path(__file__).resolve().parents[1] / "kfbot"
TESTS = Path(__file__).resolve().parent
MAX_LINES = 600

# The floors, lowest first. A module may import its own floor and the floors below it.
# The ground floor is every module directly under kfbot/ except the entry points named
# in `TOP`: errors, records, config, paths, text and the other small shared modules.
FLOORS = ("ground", "scan", "anticheat", "evaluate", "search", "github", "commands", "top")
TOP = frozenset({"kfbot.cli", "kfbot.__main__"})
# Inside a floor, its sub-packages in their own order, lowest first (docs/architecture.md).
SUB_FLOORS = {
    "kfbot.evaluate": ("sandbox", "verdict", "worker", "capture", "build", "baseline", "inputs",
                       "reference", "device", "observe", "reproduce"),
    "kfbot.scan": ("cuda", "python", "link", "show"),
    "kfbot.search": ("evolution", "rewrites", "executors", "outcome", "mutators"),
}


@dataclass(frozen=True)
class Arrow:
    """One import: `source` imports `target`, at `where` (path:line)."""

    source: str
    target: str
    where: str


@functools.cache
def modules() -> dict[str, Path]:
    """Every kfbot module by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(KFBOT.rglob("*.py")):
        parts = list(path.relative_to(KFBOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The module that defines `name`: itself, or the nearest enclosing module."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path,
              known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        parts = package.split(".")
        parent = ".".join(parts[:len(parts) - node.level + 1])
        base = f"{parent}.{base}" if base else parent
    for alias in node.names:
        # `from kfbot.scan import treesitter` imports the submodule, not the package.
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in known else base


@functools.cache
def arrows() -> tuple[Arrow, ...]:
    known = modules()
    found: list[Arrow] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(node, module, path, known):
                target = _owner(name, known) if name.startswith("kfbot") else None
                if target is not None and target != module:
                    where = f"{path.relative_to(KFBOT.parent)}:{node.lineno}"
                    found.append(Arrow(module, target, where))
    return tuple(dict.fromkeys(found))


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def floor(module: str) -> str:
    parts = module.split(".")
    if module in TOP:
        return "top"
    if len(parts) == 1 or (len(parts) == 2 and not (KFBOT / parts[1]).is_dir()):
        return "ground"
    return parts[1]


def test_the_walk_sees_every_kind_of_import() -> None:
    """The walker itself: imports inside functions and under TYPE_CHECKING count."""
    found = {(a.source, a.target) for a in arrows()}
    assert ("kfbot.cli", "kfbot.errors") in found  # module level
    assert ("kfbot.cli", "kfbot.config") in found  # inside a function
    assert len(found) > 500


def test_no_module_circle() -> None:
    edges: dict[str, set[str]] = {}
    lines: dict[tuple[str, str], str] = {}
    for arrow in arrows():
        edges.setdefault(arrow.source, set()).add(arrow.target)
        lines.setdefault((arrow.source, arrow.target), arrow.where)
    problems = []
    for component in circles(edges):
        members = set(component)
        inside = sorted(f"  {lines[(a, b)]}: {a} -> {b}" for a in component
                        for b in edges.get(a, ()) if b in members)
        problems.append(f"circle of {len(component)} modules:\n" + "\n".join(inside))
    assert not problems, "\n".join(problems)


def test_floors_import_downwards() -> None:
    for name in {floor(module) for module in modules()}:
        assert name in FLOORS, f"{name} is not a declared floor: add it to FLOORS"
    height = {name: level for level, name in enumerate(FLOORS)}
    upward = sorted({f"  {a.where}: {a.source} ({floor(a.source)}) -> {a.target} "
                     f"({floor(a.target)})" for a in arrows()
                     if height[floor(a.target)] > height[floor(a.source)]})
    assert not upward, "imports that point up a floor:\n" + "\n".join(upward)


def test_no_package_cycle() -> None:
    """Implied by the floors; said on its own so that a cycle is named as one."""
    edges: dict[str, set[str]] = {}
    for arrow in arrows():
        source, target = floor(arrow.source), floor(arrow.target)
        if source != target:
            edges.setdefault(source, set()).add(target)
    assert not circles(edges)


def packages() -> list[str]:
    return sorted(name for name, path in modules().items() if path.name == "__init__.py")


def sibling_cycles(found: Iterable[Arrow], package_names: Iterable[str]) -> list[str]:
    """For each package, the cycles among its direct sub-packages, each with the import
    lines that close it."""
    known = set(package_names)
    problems = []
    for package in sorted(known):
        def child(module: str, package: str = package) -> str | None:
            if not module.startswith(package + "."):
                return None
            name = f"{package}.{module[len(package) + 1:].split('.')[0]}"
            return name if name in known else None
        edges: dict[str, set[str]] = {}
        lines: dict[tuple[str, str], list[str]] = {}
        for arrow in found:
            source, target = child(arrow.source), child(arrow.target)
            if source and target and source != target:
                edges.setdefault(source, set()).add(target)
                lines.setdefault((source, target), []).append(
                    f"  {arrow.where}: {arrow.source} -> {arrow.target}")
        for component in circles(edges):
            members = set(component)
            inside = sorted(line for a in component for b in edges.get(a, ()) if b in members
                            for line in lines[(a, b)])
            problems.append(f"cycle of sub-packages {component}:\n" + "\n".join(inside))
    return problems


def test_sub_packages_import_one_way() -> None:
    problems = sibling_cycles(arrows(), packages())
    assert not problems, "\n".join(problems)


def test_a_sub_package_cycle_is_seen() -> None:
    """The check itself: two sibling packages importing each other through different
    modules are a cycle even though no module circle exists."""
    made_up = [Arrow("kfbot.x.a.one", "kfbot.x.b.two", "one.py:1"),
               Arrow("kfbot.x.b.three", "kfbot.x.a.four", "three.py:1"),
               Arrow("kfbot.x.c.five", "kfbot.x.a.one", "five.py:1")]
    found = sibling_cycles(made_up, ["kfbot", "kfbot.x", "kfbot.x.a", "kfbot.x.b", "kfbot.x.c"])
    assert len(found) == 1
    assert "['kfbot.x.a', 'kfbot.x.b']" in found[0]
    assert "one.py:1" in found[0] and "three.py:1" in found[0]
    assert "five.py:1" not in found[0]
    edges = {a.source: {a.target} for a in made_up}
    assert circles(edges) == []  # no module circle: only the package-level check sees it


def test_every_package_says_what_it_owns_and_may_import() -> None:
    missing = []
    for package in packages():
        path = modules()[package]
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if "import" not in doc:
            missing.append(f"  {path.relative_to(KFBOT.parent)}")
    assert not missing, ("packages whose __init__ docstring does not say what they own "
                         "and what they may import:\n" + "\n".join(missing))


def test_no_module_over_the_limit() -> None:
    over = sorted(f"  {path.relative_to(KFBOT.parent)}: {count} lines"
                  for path in modules().values()
                  if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines:\n" + "\n".join(over)


def _sub_package(module: str, package: str) -> str | None:
    """The sub-package of `package` that holds `module` (None for its own modules)."""
    if not module.startswith(package + "."):
        return None
    parts = module[len(package) + 1:].split(".")
    is_package = modules()[f"{package}.{parts[0]}"].name == "__init__.py"
    return parts[0] if is_package else None


def test_sub_packages_keep_their_declared_order() -> None:
    """evaluate's sub-packages import downwards in the order the docs draw; a new one
    must be given its place."""
    for package, order in SUB_FLOORS.items():
        found = {sub for m in modules() if (sub := _sub_package(m, package)) is not None}
        assert found <= set(order), f"{sorted(found - set(order))}: add to SUB_FLOORS[{package!r}]"
        height = {name: level for level, name in enumerate(order)}
        upward = []
        for a in arrows():
            source, target = _sub_package(a.source, package), _sub_package(a.target, package)
            if source and target and height[target] > height[source]:
                upward.append(f"  {a.where}: {a.source} -> {a.target}")
        assert not upward, f"imports that point up inside {package}:\n" + "\n".join(upward)


def test_tests_mirror_the_floors() -> None:
    """A test's folder says which floor it is about; the shared fakes and helpers, the
    ground floor's and the house's own tests stay in tests/ itself. The folders are not
    packages, so a file name must be unique across them."""
    folders = {p.name for p in TESTS.iterdir()
               if p.is_dir() and p.name not in ("data", "__pycache__")}
    floors = set(FLOORS) - {"ground", "top"}
    assert folders <= floors, f"test folders not named after a floor: {sorted(folders - floors)}"
    names = [p.name for p in TESTS.rglob("test_*.py")
             if p.relative_to(TESTS).parts[0] != "data"]
    twins = sorted({name for name in names if names.count(name) > 1})
    assert not twins, f"test files with the same name in two folders: {twins}"


def test_a_test_borrows_only_from_its_own_folder() -> None:
    """A test module imports another one only from its own folder (the folder pytest puts
    on the path when it runs that file alone); what several folders share lives in
    tests/ itself."""
    files = {p.stem: p for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] != "data"}
    far = []
    for path in files.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.module if isinstance(node, ast.ImportFrom) else None
            lender = files.get(name or "")
            if lender is not None and lender.parent != path.parent:
                far.append(f"  {path.relative_to(TESTS)}:{node.lineno} imports "
                           f"{lender.relative_to(TESTS)}")
    assert not far, "tests importing a test of another folder:\n" + "\n".join(far)
