"""A repository's test suite as kfbot runs it: one process per test file.

One pytest process for a whole suite stops at the first file it cannot collect (a
Metal twin, a CPU-only twin, a missing test dependency such as `expecttest`), and
the capture of the test that matters never starts. So the suite is split here into
files (`expand`), each run on its own; the files that cannot help are recognised
before they run (`twin_of`), and a file that fails to collect says what is missing
and the line that installs it (`collect_problem`).

    targets = expand(root, ["tests", "tests/test_x.py::test_y"])
    for target in targets: ...           # one process each; twins come back as skips

Everything here reads files; nothing runs, nothing imports torch.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.paths import default_skip, inside

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DEFAULT_PATTERNS = ("test_*.py", "*_test.py")
# Where pytest reads `python_files`, in the order it looks for its configuration.
_INI_FILES = (("pytest.ini", "pytest"), ("pyproject.toml", None), ("tox.ini", "pytest"),
              ("setup.cfg", "tool:pytest"))
# Import names whose package is called something else on PyPI.
PIP_NAMES = {
    "cv2": "opencv-python", "yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn",
    "skimage": "scikit-image", "google.protobuf": "protobuf", "attr": "attrs",
    "Crypto": "pycryptodome", "dateutil": "python-dateutil", "bs4": "beautifulsoup4",
    "hypothesis": "hypothesis", "expecttest": "expecttest", "einops": "einops",
}
_MISSING = re.compile(r"No module named '([^']+)'")
_OTHER_BACKENDS = ("mps", "xpu", "metal")
_DEVICE_WORDS = frozenset({"cuda", "cpu", "mps", "xpu"})
_OTHER_DEVICES = ("cpu", "mps", "xpu", "metal")
# Beyond this many, the nodes of a file that mixes devices share processes.
MAX_NODE_PROCESSES = 16


@dataclass(frozen=True)
class FileTarget:
    """One test file to run in its own process: all of it, or only `nodes`."""

    file: str  # repository-relative path
    nodes: tuple[str, ...] = ()  # pytest node ids, "file::test"; () for the whole file
    mixed: bool = False  # its tests are for several devices: run node by node

    @property
    def args(self) -> tuple[str, ...]:
        return self.nodes or (self.file,)


@dataclass(frozen=True)
class Skipped:
    """A test file or node not run, and why (a twin for another device)."""

    target: str
    reason: str

    def line(self) -> str:
        return f"{self.target}: skipped, {self.reason}"


@dataclass(frozen=True)
class Twin:
    """What reading a test file says about the devices it tests."""

    skip: str | None  # the whole file is for another backend (Metal, XPU): why
    mixed: bool  # tests for CUDA beside tests for other devices
    twin_names: tuple[str, ...] = ()  # classes and functions only for another device
    cuda: bool = False  # it uses a CUDA device
    cpu_only: bool = False  # it names the CPU and never CUDA

    def skip_in(self, suite_uses_cuda: bool) -> str | None:
        """Why the file is not run, in a suite of which some file uses CUDA or none:
        a CPU-only file is a twin only beside files that test on CUDA (alone, it is
        what the suite has)."""
        if self.skip is not None:
            return self.skip
        if self.cpu_only and suite_uses_cuda:
            return CPU_TWIN
        return None


CPU_TWIN = "a CPU-only twin: it never uses a CUDA device, while other test files do"


def expand(root: Path, targets: Iterable[str]) -> list[FileTarget]:
    """The test files behind `targets` (files, folders, node ids), in order, each once;
    the node ids of one file stay together."""
    patterns = python_file_patterns(root)
    order: list[str] = []
    nodes: dict[str, list[str]] = {}
    for target in targets:
        path, _, node = target.partition("::")
        files = _files_under(root, path, patterns) if (root / path).is_dir() else [path]
        for file in files:
            if file not in nodes:
                order.append(file)
                nodes[file] = []
            if node:
                nodes[file].append(target)
            else:
                nodes[file] = ["*"]  # the whole file wins over some of its nodes
    return [FileTarget(f, () if "*" in nodes[f] else tuple(dict.fromkeys(nodes[f])))
            for f in order]


def _files_under(root: Path, folder: str, patterns: Sequence[str]) -> list[str]:
    found = []
    for current, dirs, files in os.walk(root / folder):
        dirs[:] = sorted(d for d in dirs if not default_skip(d) and not d.startswith("."))
        for name in sorted(files):
            path = Path(current) / name
            if any(fnmatch.fnmatch(name, p) for p in patterns) and inside(root, path):
                found.append(path.relative_to(root).as_posix())
    return found


def python_file_patterns(root: Path) -> tuple[str, ...]:
    """The file names pytest collects in `root`: its configuration's `python_files`."""
    for name, section in _INI_FILES:
        path = root / name
        if not path.is_file() or not inside(root, path):
            continue
        found = _toml_patterns(path) if section is None else _ini_patterns(path, section)
        if found is not None:
            return found or DEFAULT_PATTERNS
    return DEFAULT_PATTERNS


def _ini_patterns(path: Path, section: str) -> tuple[str, ...] | None:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        return None
    if not parser.has_section(section):
        return None
    return tuple(parser.get(section, "python_files", fallback="").split())


def _toml_patterns(path: Path) -> tuple[str, ...] | None:
    try:
        data = tomllib.loads(path.read_text(errors="replace"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    options = data.get("tool", {}).get("pytest", {}).get("ini_options")
    if not isinstance(options, dict):
        return None
    value = options.get("python_files", [])
    return tuple(value.split() if isinstance(value, str) else map(str, value))


# --- twins ------------------------------------------------------------------------------


def twin_of(root: Path, file: str) -> Twin:
    """What the test file says about its devices, read, not run."""
    try:
        tree = ast.parse((root / file).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return Twin(None, False)  # run it: the run says what is wrong with it
    words = _device_words(tree)
    names = _twin_names(tree)
    cuda = "cuda" in words
    other = sorted(w for w in words if w in _OTHER_BACKENDS)
    if other and not cuda:
        backend = "Metal" if other[0] in ("mps", "metal") else other[0].upper()
        return Twin(f"a {backend} twin: it uses the {other[0]} device and never CUDA", False)
    if not cuda:
        named = "cpu" in words or "cpu" in Path(file).stem.lower().split("_")
        return Twin(None, False, cpu_only=named)
    mixed = bool(other or names or _device_lists(tree))
    return Twin(None, mixed, tuple(names), cuda=True)


def _device_words(tree: ast.AST) -> set[str]:
    """Devices the file names: string literals ("cuda", "cuda:0"), attributes
    (`x.cuda()`, `torch.backends.mps`) and names in skip conditions."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.split(":", 1)[0].strip().lower()
            if word in _DEVICE_WORDS:
                found.add(word)
        elif isinstance(node, ast.Attribute) and node.attr.lower() in _DEVICE_WORDS | {"metal"}:
            found.add(node.attr.lower())
        elif isinstance(node, ast.Name) and node.id.lower() in ("cuda", "mps", "metal"):
            found.add(node.id.lower())
    return found


def _device_lists(tree: ast.AST) -> bool:
    """A list or tuple of device names with CUDA and another: a device parametrization."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = {e.value.lower() for e in node.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if "cuda" in words and words & (_DEVICE_WORDS - {"cuda"}):
                return True
        if isinstance(node, ast.Name) and node.id == "instantiate_device_type_tests":
            return True
    return False


def _twin_names(tree: ast.Module) -> list[str]:
    """Top-level classes and test functions that run only without CUDA or only on
    another backend: `@skipIf(torch.cuda.is_available(), ...)`, `@skipUnless(mps)`."""
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if any(_twin_decorator(d) for d in node.decorator_list):
            out.append(node.name)
    return out


def _twin_decorator(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    head = ast.unparse(node.func).rsplit(".", 1)[-1]
    condition = ast.unparse(node.args[0]).replace(" ", "")
    other = any(b in condition.lower() for b in _OTHER_BACKENDS)
    needs_cuda = "cuda" in condition and not condition.startswith("not")
    if head in ("skipIf", "skipif"):
        # skipped when CUDA is there: the test is for the CPU; skipped unless another
        # backend is there (`not mps`): for that backend.
        return needs_cuda or (other and condition.startswith("not"))
    if head in ("skipUnless",):
        return other or (not needs_cuda and "cpu" in condition.lower())
    return False


def twin_node(node: str, names: Sequence[str] = ()) -> str | None:
    """Why the node id is another device's twin, or None."""
    parts = node.split("::")[1:]
    if not parts:
        return None
    if parts[0].split("[", 1)[0] in names:
        return f"{parts[0].split('[', 1)[0]} runs only without CUDA or on another backend"
    name, _, params = parts[-1].partition("[")
    tokens = [t.split(":", 1)[0].lower() for t in params.rstrip("]").split("-")] if params else []
    # pytest's parameter ids ([float32-cpu]), device-generic test classes (TestOpsCPU)
    # and the device suffix of their test names (test_add_cpu).
    found = [t for t in tokens if t in _OTHER_DEVICES]
    found += [d for d in _OTHER_DEVICES for cls in parts[:-1] if cls.endswith(d.upper())]
    found += [d for d in _OTHER_DEVICES if name.endswith(f"_{d}")]
    return f"its {found[0]} twin" if found else None


def node_groups(nodes: Sequence[str], limit: int = MAX_NODE_PROCESSES) -> list[tuple[str, ...]]:
    """Nodes one per process, or spread over `limit` processes when there are more."""
    if len(nodes) <= limit:
        return [(n,) for n in nodes]
    size = -(-len(nodes) // limit)
    return [tuple(nodes[i:i + size]) for i in range(0, len(nodes), size)]


# --- what a failed collection says --------------------------------------------------------


def missing_module(output: str) -> str | None:
    """The module a failed import names ("expecttest"), from a process's output."""
    found = _MISSING.findall(output)
    return found[-1] if found else None


def pip_line(module: str) -> str:
    """The line that installs the package holding `module`."""
    top = module.split(".", 1)[0]
    package = PIP_NAMES.get(module) or PIP_NAMES.get(top) or top.replace("_", "-")
    return f"pip install {package}"


def collect_problem(output: str) -> str | None:
    """Why pytest could not collect a file, when its output says so: the missing
    module and the line that installs it, or the error's own line."""
    if "ERROR collecting" not in output and "ImportError while importing" not in output:
        return None
    module = missing_module(output)
    if module is not None:
        return f"cannot be collected: no module named {module!r} ({pip_line(module)})"
    errors = [line.strip().removeprefix("E").strip() for line in output.splitlines()
              if re.match(r"^E\s+\w+(Error|Exception)\b", line)]
    return f"cannot be collected: {errors[-1][:200]}" if errors else "cannot be collected"
