"""The cheat corpus, fixtures/cheats: every entry is well formed and every candidate compiles.

Each entry is a folder holding `cheat.yaml` (what the candidate does and which check
must reject it, or `verdict: accepted` for an honest candidate) and `files/`, whole
replacement files given by their path in the fixture the entry names. A GPU test and
a benchmark script run these candidates through kfbot; this test only makes sure they
are what they claim to be on paper:

- `cheat.yaml` has exactly the documented keys with valid values, names an existing
  fixture, a kernel that fixture defines, and files that exist there;
- the README's table lists every entry as its `cheat.yaml` describes it;
- an honest candidate adds nothing the static rules would flag (a crude identifier
  check) and, in a Python file, changes only string literal contents;
- every `.cu` compiles with nvcc against its fixture (its device code; the host code is
  checked by nvcc's front end), and an inline candidate's CUDA string compiles the way
  load_inline writes it (two compiles at a time; the ones that include torch's headers
  take 10-15 s each on a small machine).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cuda_compile import NVCC, cuda_include, torch_includes

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
CHEATS = FIXTURES / "cheats"

REQUIRED_KEYS = {"exploit", "fixture", "kernel", "verdict"}
OPTIONAL_KEYS = {"check", "runtime_check", "tolerances"}
VERDICTS = {"rejected": "cheat-", "accepted": "honest-"}
STATIC_CHECKS = {
    "library-call", "concurrency", "persistent-state", "file-or-env-access", "device-printf",
    "precision-downcast", "exception-fallback", "timer-or-grader-access", "l2-persistence",
    "unlaunched-kernel", "no-kernel-launch", "edit-outside-task", "python-edit",
    "size-special-case",
}
RUNTIME_CHECKS = {
    "output-poison", "input-mutation", "constant-output", "repeat-calls", "timed-output",
    "timer-disagreement", "foreign-kernels", "no-own-kernel", "side-stream", "correctness",
    "non-finite", "precision-loss", "numeric-flags", "clean-room", "broken-context",
}
DTYPES = {"float64", "float32", "float16", "bfloat16"}
MIN_REJECTED = 16
MIN_ACCEPTED = 8
# Files an entry adds to its fixture on purpose, by entry name (none so far).
ADDED_ON_PURPOSE: dict[str, set[str]] = {}

# Identifiers the static rules look for; an honest candidate must not add any of them.
FLAGGED_IDENTIFIERS = {
    "static", "thread_local", "try", "catch", "throw",
    "half", "__half", "__half2", "__nv_bfloat16", "__float2half", "__half2float",
    "__float2bfloat16", "__bfloat162float",
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
    "cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventRecord", "cudaStreamWaitEvent",
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaStreamQuery",
    "cudaStreamBeginCapture", "cudaGraphLaunch", "thread", "async",
    "printf", "fprintf", "getenv", "fopen", "ifstream", "ofstream",
    "cudaEventElapsedTime", "clock", "clock64", "chrono", "dlsym", "PyObject_Call",
    "cudaStreamSetAttribute", "cudaDeviceSetLimit", "accessPolicyWindow",
    "from_blob", "cublasSgemm", "cublasGemmEx", "cudnnConvolutionForward", "thrust", "cub",
    "cutlass",
}


@dataclass(frozen=True)
class Entry:
    name: str
    folder: Path

    @property
    def files_dir(self) -> Path:
        return self.folder / "files"

    def files(self) -> list[str]:
        """Paths relative to the fixture root, sorted."""
        return sorted(p.relative_to(self.files_dir).as_posix()
                      for p in self.files_dir.rglob("*") if p.is_file())

    @functools.cached_property
    def meta(self) -> dict[str, Any]:
        data = yaml.safe_load((self.folder / "cheat.yaml").read_text())
        assert isinstance(data, dict), f"{self.name}/cheat.yaml is not a mapping"
        return data

    @property
    def fixture_root(self) -> Path:
        return FIXTURES / str(self.meta["fixture"])


def _entries() -> list[Entry]:
    if not CHEATS.is_dir():
        return []
    return [Entry(p.name, p) for p in sorted(CHEATS.iterdir()) if p.is_dir()]


ENTRIES = _entries()


def _entry_id(entry: Entry) -> str:
    return entry.name


def _field(entry: Entry, key: str) -> object:
    """A cheat.yaml value for selecting entries; a broken file fails its own test instead."""
    try:
        return entry.meta.get(key)
    except (OSError, yaml.YAMLError, AssertionError):
        return None


# --- cheat.yaml -----------------------------------------------------------------------


def test_corpus_size() -> None:
    verdicts = [_field(e, "verdict") for e in ENTRIES]
    assert verdicts.count("rejected") >= MIN_REJECTED
    assert verdicts.count("accepted") >= MIN_ACCEPTED
    extra = sorted(p.name for p in CHEATS.iterdir() if p.is_file() and p.name != "README.md")
    assert extra == [], "only entry folders and README.md belong in fixtures/cheats"


@pytest.mark.parametrize("entry", ENTRIES, ids=_entry_id)
def test_entry_is_well_formed(entry: Entry) -> None:
    meta = entry.meta
    keys = set(meta)
    assert keys >= REQUIRED_KEYS, f"missing keys: {sorted(REQUIRED_KEYS - keys)}"
    assert keys <= REQUIRED_KEYS | OPTIONAL_KEYS, (
        f"unknown keys: {sorted(keys - REQUIRED_KEYS - OPTIONAL_KEYS)}")
    assert sorted(p.name for p in entry.folder.iterdir()) == ["cheat.yaml", "files"]

    exploit = meta["exploit"]
    assert isinstance(exploit, str) and exploit.strip() and "\n" not in exploit.strip()

    verdict = meta["verdict"]
    assert verdict in VERDICTS, f"verdict must be one of {sorted(VERDICTS)}"
    assert entry.name.startswith(VERDICTS[verdict]), (
        f"a {verdict} entry is named {VERDICTS[verdict]}<short>")
    if verdict == "rejected":
        assert meta.get("check") in STATIC_CHECKS | RUNTIME_CHECKS, f"check: {meta.get('check')}"
    else:
        assert "check" not in meta and "runtime_check" not in meta, "honest entries name no check"
    if "runtime_check" in meta:
        assert meta["runtime_check"] in RUNTIME_CHECKS, f"runtime_check: {meta['runtime_check']}"
    if "tolerances" in meta:
        _check_tolerances(meta["tolerances"])


def _check_tolerances(tolerances: object) -> None:
    assert isinstance(tolerances, dict) and tolerances, "tolerances: {dtype: [atol, rtol]}"
    for dtype, pair in tolerances.items():
        assert dtype in DTYPES, f"tolerances: unknown dtype {dtype!r}"
        assert isinstance(pair, list) and len(pair) == 2, f"tolerances.{dtype}: [atol, rtol]"
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                   for v in pair), f"tolerances.{dtype}: non-negative numbers"


@pytest.mark.parametrize("entry", ENTRIES, ids=_entry_id)
def test_entry_targets_its_fixture(entry: Entry) -> None:
    fixture = str(entry.meta["fixture"])
    assert fixture not in {"cheats", "hostile"} and entry.fixture_root.is_dir(), (
        f"no fixture {fixture!r} under fixtures/")
    files = entry.files()
    assert files, "files/ holds no replacement file"
    added = ADDED_ON_PURPOSE.get(entry.name, set())
    for rel in files:
        assert (entry.fixture_root / rel).is_file() or rel in added, (
            f"{rel} does not exist in fixtures/{fixture}")
    kernel = str(entry.meta["kernel"])
    defined = re.compile(r"__global__[^;{}]*\b" + re.escape(kernel) + r"\s*\(")
    sources = [*entry.fixture_root.rglob("*.cu"), *entry.fixture_root.rglob("*.py")]
    assert any(defined.search(p.read_text(errors="replace")) for p in sources
               if "build" not in p.relative_to(entry.fixture_root).parts), (
        f"fixtures/{fixture} defines no kernel {kernel!r}")


def _readme_rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in (CHEATS / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_readme_lists_every_entry() -> None:
    rows = _readme_rows()
    assert sorted(rows) == [e.name for e in ENTRIES]
    for entry in ENTRIES:
        meta = entry.meta
        expected = [meta["fixture"], meta["verdict"], meta.get("check", "-"),
                    meta.get("runtime_check", "-")]
        assert [c.strip("`") for c in rows[entry.name][1:5]] == expected, entry.name


# --- honest candidates ----------------------------------------------------------------


_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'',
                                re.S)


def _cuda_text(path: Path) -> str:
    """The C++/CUDA source of a file: the file itself, or a Python file's string constants."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    return "\n".join(node.value for node in ast.walk(ast.parse(text))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str))


def _identifiers(source: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", _COMMENT_OR_STRING.sub(" ", source)))


def _without_strings(source: str) -> str:
    """The AST dump of a Python file with every string literal emptied."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def _flagged_additions(entry: Entry) -> dict[str, list[str]]:
    """Per edited file, the flagged identifiers it has and the original lacks."""
    found = {}
    for rel in entry.files():
        original = entry.fixture_root / rel
        before = _identifiers(_cuda_text(original)) if original.is_file() else set()
        added = (_identifiers(_cuda_text(entry.files_dir / rel)) - before) & FLAGGED_IDENTIFIERS
        if added:
            found[rel] = sorted(added)
    return found


HONEST = [e for e in ENTRIES if _field(e, "verdict") == "accepted"]
# Cheats only a runtime check names: no static rule may reject them first.
RUNTIME_ONLY = [e for e in ENTRIES if _field(e, "check") in RUNTIME_CHECKS]


@pytest.mark.parametrize("entry", RUNTIME_ONLY, ids=_entry_id)
def test_runtime_only_cheat_adds_nothing_flagged(entry: Entry) -> None:
    assert _flagged_additions(entry) == {}
    assert entry.meta.get("runtime_check") in (None, entry.meta["check"])


@pytest.mark.parametrize("entry", HONEST, ids=_entry_id)
def test_honest_candidate_adds_nothing_flagged(entry: Entry) -> None:
    assert _flagged_additions(entry) == {}
    for rel in entry.files():
        original = entry.fixture_root / rel
        assert original.is_file(), f"an honest candidate edits existing files only: {rel}"
        if rel.endswith(".py"):
            assert _without_strings((entry.files_dir / rel).read_text()) == _without_strings(
                original.read_text()), f"{rel} changes more than string literal contents"


def test_python_edit_cheats_change_code() -> None:
    for entry in ENTRIES:
        if _field(entry, "check") != "python-edit":
            continue
        changed = [rel for rel in entry.files() if rel.endswith(".py")
                   and _without_strings((entry.files_dir / rel).read_text())
                   != _without_strings((entry.fixture_root / rel).read_text())]
        assert changed, f"{entry.name}: no Python change outside string literals"


# --- compiles -------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One nvcc compile: a candidate .cu, or an inline candidate's CUDA string."""

    entry: Entry
    rel: str  # the file's path in the fixture

    @property
    def id(self) -> str:
        return f"{self.entry.name}/{self.rel}"

    @property
    def inline(self) -> bool:
        return self.rel.endswith(".py")

    @property
    def includes_torch(self) -> bool:
        """Compiles that parse torch's headers take 20-45 s; the others 1-2 s."""
        text = (self.entry.files_dir / self.rel).read_text()
        return self.inline or "<ATen/" in text or "<torch/" in text


def _inline_strings(path: Path) -> dict[str, str]:
    """Module-level `name = "..."` string assignments of a Python file."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            found[node.targets[0].id] = node.value.value
    return found


def _jobs() -> Iterator[Job]:
    for entry in ENTRIES:
        for rel in entry.files():
            if rel.endswith(".cu") or (
                    rel.endswith(".py") and "cuda_src" in _inline_strings(entry.files_dir / rel)):
                yield Job(entry, rel)


JOBS = list(_jobs())


def _command(job: Job, out_dir: Path) -> list[str]:
    assert NVCC is not None
    root = job.entry.fixture_root
    dirs = [str(root / "include"), str(root), *torch_includes(), sysconfig.get_paths()["include"]]
    cuda = cuda_include()
    if cuda is not None:
        dirs.append(cuda)
    if job.inline:
        # As torch.utils.cpp_extension.load_inline writes cuda.cu (see test_fixtures_compile).
        cuda_src = _inline_strings(job.entry.files_dir / job.rel)["cuda_src"]
        source = out_dir / "cuda.cu"
        source.write_text("\n".join([
            "#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>", cuda_src,
        ]))
        defines = [f"-DTORCH_EXTENSION_NAME={root.name}"]
    else:
        source = job.entry.files_dir / job.rel
        defines = [f"-DTORCH_EXTENSION_NAME={root.name}_ext", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    # Device code only (-cubin): nvcc's front end still parses and checks the host code,
    # and skipping g++ on torch's headers takes a torch-header file from about 35 s to
    # 12 s here. tests/anticheat/test_anticheat_gpu.py builds every candidate in full.
    return [NVCC, "-cubin", "-std=c++17", "-arch=sm_90", *defines,
            *(f"-I{d}" for d in dirs if Path(d).is_dir()), str(source),
            "-o", str(out_dir / (source.stem + ".cubin"))]


def _compile(job: Job) -> str | None:
    """None when the compile succeeds, else the command and its output."""
    with tempfile.TemporaryDirectory(prefix="kfbot-cheat-") as tmp:
        cmd = _command(job, Path(tmp))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode == 0:
        return None
    return f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def compile_errors(request: pytest.FixtureRequest) -> dict[str, str | None]:
    """Compile the jobs this session selected, two at a time."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    torch_includes()
    selected: set[str] = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        job = callspec.params.get("job") if callspec is not None else None
        if isinstance(job, Job):
            selected.add(job.id)
    # The slow compiles first, so the two workers finish together.
    jobs = sorted((j for j in JOBS if j.id in selected), key=lambda j: not j.includes_torch)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([j.id for j in jobs], pool.map(_compile, jobs), strict=True))


def test_every_candidate_source_is_compiled() -> None:
    compiled = {j.id for j in JOBS}
    for entry in ENTRIES:
        for rel in entry.files():
            if rel.endswith(".cu"):
                assert f"{entry.name}/{rel}" in compiled
    inline = [j for j in JOBS if j.inline]
    assert inline, "the inline_softmax candidates' CUDA strings are compiled too"


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.id)
def test_candidate_compiles(job: Job, compile_errors: dict[str, str | None]) -> None:
    error = compile_errors[job.id]
    assert error is None, error
