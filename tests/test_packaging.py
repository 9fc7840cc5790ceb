"""The wheel: what it holds (every kfbot package, the JSON schema, the rules/ folder),
what a plain `pip install kfbot` pulls (no PyGithub, anthropic, torch or Ray: those are
extras), and a light install that scans and checks and names the extra a command needs."""

from __future__ import annotations

import email.parser
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"anthropic", "pygithub", "torch", "numpy", "ray", "cryptography", "pydantic",
         "httpx", "requests", "pytest", "matplotlib"}
# What each extra's commands need: the capture runs the repository's tests with pytest,
# optimize draws its chart with matplotlib.
EXTRAS = {"github": {"pygithub"}, "llm": {"anthropic"},
          "gpu": {"torch", "numpy", "pytest", "matplotlib"}, "ray": {"ray"}}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel, and what its build printed."""
    where = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(where), str(ROOT)],
                          check=True, capture_output=True, text=True)
    (wheel,) = where.glob("kfbot-*.whl")
    return wheel, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(built: tuple[Path, str]) -> Path:
    return built[0]


def test_the_build_warns_of_nothing(built: tuple[Path, str]) -> None:
    """An install from source (the Action's) prints no packaging warning: a folder of the
    package that `packages` does not list draws forty lines from setuptools on every
    install, and would be left out of the wheel but for a glob."""
    assert not any(w in built[1] for w in ("BuildBackendWarning",
                                           "SetuptoolsDeprecationWarning")), built[1]


def requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def plain(reqs: list[Requirement]) -> list[Requirement]:
    """What `pip install kfbot` installs: the requirements without an extra."""
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(reqs: list[Requirement]) -> dict[str, importlib.metadata.Distribution]:
    """The distributions those requirements pull, read from the installed metadata of
    this (development) environment, which has every one of them."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(reqs)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = importlib.metadata.distribution(req.name)
        found[name] = dist
        todo += plain([Requirement(r) for r in dist.requires or []])
    return found


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "kfbot").rglob("*.py")}
    for package in packages:
        assert f"{package}/__init__.py" in names, f"{package} is missing from the wheel"
    assert "kfbot/schemas/scan-v1.json" in names
    rules = {p.relative_to(ROOT / "rules").as_posix() for p in (ROOT / "rules").rglob("*")
             if p.is_file()}
    assert rules and {f"kfbot/rules/{r}" for r in rules} <= names
    assert "kfbot/rules/anticheat.yaml" in names  # the static anti-cheating rules
    assert not any(n.startswith(("tests/", "fixtures/")) for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)  # Apache-2.0


def test_a_plain_install_pulls_no_github_llm_gpu_or_ray(wheel: Path) -> None:
    reqs = requirements(wheel)
    pulled = set(closure(plain(reqs)))
    assert {"tree-sitter", "tree-sitter-cuda", "tree-sitter-cpp", "pyyaml", "rich"} <= pulled
    assert not pulled & HEAVY, sorted(pulled & HEAVY)
    assert len(pulled) <= 10, sorted(pulled)
    for extra, wanted in EXTRAS.items():
        brought = {canonicalize_name(r.name) for r in reqs
                   if r.marker is not None and r.marker.evaluate({"extra": extra})}
        assert wanted <= brought, extra


# --- a light install: the wheel and its plain requirements, nothing else ----------------------


@pytest.fixture(scope="module")
def light_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtual environment holding the unpacked wheel and the modules of its plain
    requirements (linked from this environment): PyGithub, anthropic and torch are not
    there to import."""
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    zipfile.ZipFile(wheel).extractall(purelib)
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in closure(plain(requirements(wheel))).values():
        for top in _top_level(dist):
            if (here / top).exists() and not (purelib / top).exists():
                (purelib / top).symlink_to(here / top)
    yield python


def _top_level(dist: importlib.metadata.Distribution) -> set[str]:
    """The modules and folders a distribution put into site-packages."""
    tops = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            tops.add(first)
    return tops


def light(python: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "ANTHROPIC"))}
    return subprocess.run([str(python), "-m", "kfbot", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_light_install_cannot_import_the_extras(light_python: Path) -> None:
    probe = subprocess.run([str(light_python), "-c", "import importlib.util as u; print("
                            "[m for m in ('github', 'anthropic', 'torch', 'ray', 'yaml', "
                            "'tree_sitter_cuda', 'rich') if u.find_spec(m)])"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "['yaml', 'tree_sitter_cuda', 'rich']"


def test_the_light_install_scans_and_plans(light_python: Path) -> None:
    scanned = light(light_python, "scan", "--repo", "fixtures/example", "--json")
    assert scanned.returncode == 0, scanned.stderr
    assert '"softmax_kernel"' in scanned.stdout
    planned = light(light_python, "optimize", "softmax_kernel", "--repo", "fixtures/example",
                    "--dry-run", "--seed", "1")
    assert planned.returncode == 0, planned.stderr
    assert "llm: the anthropic package is not installed (pip install 'kfbot[llm]')" \
           in planned.stdout


@pytest.mark.parametrize(("args", "extra"), [
    (("action",), "PyGithub, which is not installed: pip install 'kfbot[github]'"),
    (("verify", "softmax_kernel", "--repo", "fixtures/example"),
     "torch, which is not installed: pip install 'kfbot[gpu]'"),
    (("optimize", "softmax_kernel", "--repo", "fixtures/example", "--no-llm"),
     "torch, which is not installed: pip install 'kfbot[gpu]'"),
])
def test_a_command_that_needs_an_extra_names_it(light_python: Path, args: tuple[str, ...],
                                                extra: str) -> None:
    proc = light(light_python, *args)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"kfbot: error: kfbot {args[0]} needs {extra}" in proc.stderr
