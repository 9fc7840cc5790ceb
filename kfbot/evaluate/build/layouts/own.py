"""The repository's own build, for the layouts kfbot cannot build object by object.

Where the scan cannot read a build (extensions made in a loop, names and sources
computed at run time, a `setup.py` that runs CMake, a `pyproject.toml` backend), the
repository builds itself, the way its developers do:

- `python setup.py build_ext --inplace` in the folder of its `setup.py`, which leaves
  each library beside the Python package that loads it;
- `pip install --no-build-isolation --no-deps --target <private folder> .` where there
  is only a `pyproject.toml`: installed into a folder of kfbot's, never the user's
  environment.

It runs in a copy of the repository under kfbot's cache, keyed by the repository's
content, so a commit is built once. The copy where the build ran (the *workshop*) keeps
the build's objects; a snapshot of it right after the build is the original that the
repository's tests import. A candidate is built in the same workshop: its files are
written, the same command runs again (torch's ninja build recompiles the objects whose
sources or headers changed; setuptools without ninja the extensions whose sources
changed, and every one when a header changed), its library is copied out, and the
original files are written back with a new time, so the next build recompiles them.
A workshop serves one build at a time (a file lock, across processes too).

A `setup.py` is a program: every build runs through `run_process` with the allowlisted
environment of untrusted code.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.sandbox.processes import Ran, run_process, tail
from kfbot.paths import copy_repository, default_skip, inside

Method = Literal["build_ext", "pip"]
Progress = Callable[[str], None]
DEFAULT_TIMEOUT_S = 3600.0
HEARTBEAT_S = 60.0
KEEP_BUILDS = 4  # the repository's own builds kept in the cache (the most recent)
SITE = ".kfbot-site"  # the pip method's private install folder, inside the workshop
_DIRTY = "dirty.json"  # candidate files written into the workshop and not yet restored
_TRANSLATION_UNITS = (".cu", ".cpp", ".cc", ".cxx", ".c")
_LIBRARY_SUFFIXES = (".so", ".pyd", ".dylib")
EVIDENCE_BYTES = 64 * 1024  # of a build's output, kept to find its error lines in
_ERROR = re.compile(r"\berror\b|CMake Error|fatal:|No such file or directory", re.IGNORECASE)


@dataclass(frozen=True)
class OwnRecipe:
    """How the repository builds itself: which file, in which folder, by which command."""

    file: str  # repository path of the setup.py or pyproject.toml
    method: Method

    @property
    def folder(self) -> str:
        """The folder it runs in, "" for the repository's root."""
        parent = Path(self.file).parent.as_posix()
        return "" if parent == "." else parent

    def command(self, python: str) -> list[str]:
        """The build, run in `folder` (`-u`: its output reaches the log as it comes)."""
        if self.method == "build_ext":
            return [python, "-u", "setup.py", "build_ext", "--inplace"]
        return [python, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                "--no-input", "--upgrade", "--target", SITE, "."]

    def typed(self) -> str:
        """The command as a person would type it in `folder`."""
        return " ".join(["python", *self.command("python")[1:]])

    def shown(self) -> str:
        where = f" in {self.folder}/" if self.folder else ""
        return f"`{self.typed()}`{where}"

    def library_root(self, tree: Path) -> Path:
        """Where the built libraries' module paths start."""
        folder = tree / self.folder
        return folder / SITE if self.method == "pip" else folder


def own_recipe(file: str) -> OwnRecipe:
    return OwnRecipe(file, "pip" if Path(file).name == "pyproject.toml" else "build_ext")


@dataclass(frozen=True)
class OwnBuild:
    """The original, as the repository's own build made it."""

    recipe: OwnRecipe
    key: str
    workshop: Path  # where builds run
    original: Path  # the tree right after the original's build: what its tests import
    libraries: tuple[str, ...]  # the libraries the build made, paths inside `original`
    ok: bool
    why: str  # one line: what happened
    tail: str  # the end of the build's output
    seconds: float
    cached: bool = False
    ninja: bool = False  # torch's ninja build: candidates recompile only what changed

    def module_name(self, library: str) -> str:
        """The dotted module a library is imported as: `pkg/_ops.cpython-312-...so`
        built in `pkg`'s parent folder is `pkg._ops`."""
        root = self.recipe.library_root(self.original)
        rel = (self.original / library).relative_to(root)
        return ".".join([*rel.parent.parts, rel.name.split(".", 1)[0]])

    def evidence(self) -> str:
        return build_evidence(self.tail)

    def to_json(self) -> dict[str, object]:
        return {"file": self.recipe.file, "method": self.recipe.method, "key": self.key,
                "libraries": list(self.libraries), "ok": self.ok, "why": self.why,
                "tail": self.tail, "seconds": self.seconds, "ninja": self.ninja}


@dataclass(frozen=True)
class CandidateLibrary:
    """A candidate's library, built the repository's way."""

    ok: bool
    artifact: Path | None
    why: str
    tail: str
    seconds: float


@dataclass
class OwnBuilder:
    """Runs the repository's own builds under `cache_dir`, one per content."""

    cache_dir: Path
    timeout_s: float = DEFAULT_TIMEOUT_S
    progress: Progress | None = None
    python: str = sys.executable
    heartbeat_s: float = HEARTBEAT_S
    _locks: dict[str, threading.Lock] = field(default_factory=dict)

    # --- the original ------------------------------------------------------------------

    def original(self, root: Path, recipe: OwnRecipe) -> OwnBuild:
        """The repository built its own way: from the cache when this content was built
        before, else now (a failed build is remembered too: it fails the same way)."""
        key = content_key(root, recipe, self.python)
        home = self.cache_dir / key
        with self._exclusive(home):
            done = _load(home, recipe, key)
            if done is not None:
                return done
            built = self._build_original(root, recipe, key, home)
            (home / "result.json").write_text(json.dumps(built.to_json()))
        _prune(self.cache_dir, keep=KEEP_BUILDS)
        return built

    def _build_original(self, root: Path, recipe: OwnRecipe, key: str, home: Path) -> OwnBuild:
        workshop, original = home / "workshop", home / "original"
        for folder in (workshop, original):
            shutil.rmtree(folder, ignore_errors=True)
        copy_repository(root, workshop)
        if not (workshop / recipe.file).is_file():
            return OwnBuild(recipe, key, workshop, original, (), False,
                            f"{recipe.file} is not in the copy of the repository", "", 0.0)
        before = _libraries(workshop)
        log = home / "build.log"
        ran = self._run(recipe, workshop, log, f"building {recipe.file}")
        ran = replace(ran, tail=tail(log, EVIDENCE_BYTES))
        temp = f"{recipe.folder}/build/" if recipe.folder else "build/"
        made = tuple(sorted(p for p, stamp in _libraries(workshop).items()
                            if before.get(p) != stamp and not p.startswith(temp)))
        _snapshot(workshop, original, recipe)
        ninja = any(workshop.rglob("build.ninja"))
        if not ran.ok:
            why = f"{recipe.shown()} {ran.how()}"
            return OwnBuild(recipe, key, workshop, original, made, False, why, ran.tail,
                            ran.seconds, ninja=ninja)
        if not made:
            why = f"{recipe.shown()} succeeded but made no library"
            return OwnBuild(recipe, key, workshop, original, (), False, why, ran.tail,
                            ran.seconds, ninja=ninja)
        why = f"{recipe.shown()} built {_count(len(made), 'library', 'libraries')} in a " \
              f"scratch copy in {ran.seconds:.0f} s"
        return OwnBuild(recipe, key, workshop, original, made, True, why, ran.tail,
                        ran.seconds, ninja=ninja)

    # --- candidates ----------------------------------------------------------------------

    def candidate(self, build: OwnBuild, library: str, files: Mapping[str, str],
                  tag: str) -> CandidateLibrary:
        """`library` rebuilt with `files` (repository path -> text) in place of the
        original's, copied out under `tag`; the workshop is left as the original."""
        if not build.ok:
            return CandidateLibrary(False, None, build.why, build.tail, 0.0)
        home = build.workshop.parent
        target = home / "candidates" / tag / Path(library).name
        with self._exclusive(home):
            if target.is_file():
                return CandidateLibrary(True, target, "built before", "", 0.0)
            restore(build)
            _write_dirty(home, list(files))
            try:
                for rel, text in files.items():
                    _write(build.workshop / rel, text)
                if not build.ninja and not all(f.endswith(_TRANSLATION_UNITS) for f in files):
                    _touch_units(build.workshop / build.recipe.folder)
                started = time.time()
                ran = self._run(build.recipe, build.workshop, home / f"candidate-{tag}.log",
                                f"building a candidate with {build.recipe.file}")
                return _copied_out(build, library, target, ran, started)
            finally:
                restore(build)

    # --- running -------------------------------------------------------------------------

    def _run(self, recipe: OwnRecipe, workshop: Path, log: Path, what: str) -> Ran:
        # FORCE_CUDA: the switch many setup scripts read to compile their CUDA sources
        # where torch sees no GPU (a build machine, a container without one).
        env = untrusted_env({"PYTHONDONTWRITEBYTECODE": "1", "MAX_JOBS": str(_jobs()),
                             "FORCE_CUDA": "1"})
        folder = workshop / recipe.folder
        with _heartbeat(self.progress, what, log, self.heartbeat_s, workshop):
            # Sandboxed: the build writes its scratch copy, nothing else of this machine.
            return run_process(recipe.command(self.python), folder, env, self.timeout_s, log,
                               writable=[workshop])

    @contextlib.contextmanager
    def _exclusive(self, home: Path) -> Iterator[None]:
        """One build per workshop: a thread lock here, a file lock for other processes."""
        lock = self._locks.setdefault(str(home), threading.Lock())
        home.mkdir(parents=True, exist_ok=True)
        with lock, open(home / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _prune(cache_dir: Path, keep: int) -> None:
    """Remove all but the `keep` most recent builds (a build tree can be large, and a
    new commit is a new one); a build another process is using is left alone."""
    done = sorted((p for p in cache_dir.glob("*/result.json")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for result in done[keep:]:
        home = result.parent
        with open(home / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            result.unlink()  # first: a half-removed build is never taken for a whole one
            for part in ("workshop", "original", "candidates", "mutants"):
                shutil.rmtree(home / part, ignore_errors=True)


def restore(build: OwnBuild) -> None:
    """Write back the original text of the files a candidate changed (an interrupted
    build may have left some), with a new time so the next build recompiles them."""
    home = build.workshop.parent
    marker = home / _DIRTY
    if not marker.is_file():
        return
    for rel in json.loads(marker.read_text()):
        source, dest = build.original / rel, build.workshop / rel
        if source.is_file():
            shutil.copyfile(source, dest)
        else:
            dest.unlink(missing_ok=True)  # a file the candidate added
    marker.unlink()


def build_evidence(output: str, errors: int = 8, last: int = 6) -> str:
    """A failed build's own error lines (a compiler's, CMake's), then its last lines:
    the end of a build's output is usually the traceback of the tool that ran it."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    found = [line for line in lines if _ERROR.search(line) and not line.lstrip().startswith(
        ('File "', "Traceback", "raise ", "subprocess.CalledProcessError"))]
    tail_lines = [line for line in lines[-last:] if line not in found]
    return "\n".join([*dict.fromkeys(found[:errors]), *(["..."] if found else []),
                      *tail_lines]) if found else "\n".join(lines[-15:])


def _copied_out(build: OwnBuild, library: str, target: Path, ran: Ran,
                started: float) -> CandidateLibrary:
    built = build.workshop / library
    if not ran.ok:
        return CandidateLibrary(False, None, f"{build.recipe.shown()} {ran.how()}", ran.tail,
                                ran.seconds)
    if not built.is_file() or built.stat().st_mtime < started:
        return CandidateLibrary(False, None, f"{build.recipe.shown()} did not rebuild "
                                f"{library}", ran.tail, ran.seconds)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.part")
    shutil.copyfile(built, scratch)
    os.replace(scratch, target)
    return CandidateLibrary(True, target, f"rebuilt by {build.recipe.shown()}", ran.tail,
                            ran.seconds)


def _load(home: Path, recipe: OwnRecipe, key: str) -> OwnBuild | None:
    path = home / "result.json"
    if not path.is_file() or not (home / "original").is_dir():
        return None
    data = json.loads(path.read_text())
    libraries = tuple(str(p) for p in data["libraries"])
    if data["ok"] and not all((home / "original" / p).is_file() for p in libraries):
        return None
    build = OwnBuild(recipe, key, home / "workshop", home / "original", libraries,
                     bool(data["ok"]), str(data["why"]), str(data["tail"]),
                     float(data["seconds"]), cached=True, ninja=bool(data.get("ninja")))
    restore(build)
    return build


def content_key(root: Path, recipe: OwnRecipe, python: str) -> str:
    """The repository's files, the recipe and the toolchain it builds with: a commit
    builds once, and a changed file, compiler or torch builds again."""
    digest = hashlib.sha256()
    for rel, path in _files(root):
        digest.update(rel.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    toolchain = [python, recipe.file, recipe.method, _torch_version(python),
                 os.environ.get("CUDA_HOME", ""), shutil.which("nvcc") or "",
                 os.environ.get("TORCH_CUDA_ARCH_LIST", "")]
    digest.update(json.dumps(toolchain).encode())
    return digest.hexdigest()[:24]


def _files(root: Path) -> Iterator[tuple[str, Path]]:
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not default_skip(d) and d != ".kfbot")
        for name in sorted(names):
            path = Path(folder) / name
            if inside(root, path) and not name.endswith(_LIBRARY_SUFFIXES):
                yield path.relative_to(root).as_posix(), path


def _torch_version(python: str) -> str:
    """torch's version file, read without importing torch (it is the build's torch
    when `python` is this interpreter)."""
    if python != sys.executable:
        return python
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return ""
    version = Path(spec.origin).parent / "version.py"
    return version.read_text() if version.is_file() else ""


def _libraries(tree: Path) -> dict[str, int]:
    """Every library file in the tree and its modification time."""
    found = {}
    for folder, dirs, names in os.walk(tree):
        dirs[:] = [d for d in dirs if d not in (".git", "__pycache__")]
        for name in names:
            if name.endswith(_LIBRARY_SUFFIXES) or ".so." in name:
                path = Path(folder) / name
                if not path.is_symlink():
                    found[path.relative_to(tree).as_posix()] = path.stat().st_mtime_ns
    return found


def _snapshot(workshop: Path, original: Path, recipe: OwnRecipe) -> None:
    """The built tree without the build's objects (the tests do not need them)."""
    temp = workshop / recipe.folder / "build"

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if Path(folder, n) == temp or n == ".lock"]

    shutil.copytree(workshop, original, symlinks=True, ignore=ignore)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _write_dirty(home: Path, files: Sequence[str]) -> None:
    (home / _DIRTY).write_text(json.dumps(list(files)))


def _touch_units(folder: Path) -> None:
    """Without ninja, setuptools recompiles an extension only when one of its listed
    sources is newer than it: a changed header must make every source newer."""
    now = time.time()
    for path in folder.rglob("*"):
        if path.suffix in _TRANSLATION_UNITS and path.is_file():
            os.utime(path, (now, now))


def _jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


@contextlib.contextmanager
def _heartbeat(progress: Progress | None, what: str, log: Path,
               every_s: float, workshop: Path) -> Iterator[None]:
    """A line every `every_s` while a long build runs (its time and last output line),
    so that a CI log never goes silent."""
    if progress is None:
        yield
        return
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            text = ""
            with contextlib.suppress(OSError):
                text = tail(log, 16384)
            progress(f"{what}: {time.monotonic() - started:.0f} s so far"
                     + build_progress(text.replace(f"{workshop}/", "")))

    thread = threading.Thread(target=beat, name="kfbot-build-heartbeat", daemon=True)
    progress(f"{what} (the repository's own build; a line every {every_s:.0f} s)")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]", re.MULTILINE)
_COMPILED_FILE = re.compile(r"(?:^|\s)(?:-c\s+)?([\w./+-]+\.(?:cu|cpp|cc|cxx|c))(?=\s|$)")


def build_progress(output: str) -> str:
    """What a heartbeat says of a build's output so far: ninja's step count, the file
    being compiled, else its last line (cut short)."""
    steps = _NINJA_STEP.findall(output)
    done = f"; step {steps[-1][0]} of {steps[-1][1]}" if steps else ""
    lines = [line for line in output.splitlines() if line.strip()]
    for line in reversed(lines[-20:]):
        files = _COMPILED_FILE.findall(line)
        if files:
            return f"{done}; compiling {files[-1]}"
    return f"{done}; last output: {lines[-1].strip()[:120]}" if lines else done


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
