"""The one module that talks to `torch.utils.cpp_extension`.

The builder compiles and links by itself (object by object, cached), but the flags
must be exactly the ones torch would use, and torch only exposes them through the
ninja file it writes. So torch writes that file here, for sources that need not
exist, and nothing is compiled. Everything torch-specific is imported lazily:
importing kfbot must never import torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from kfbot.errors import EXIT_MISSING_TOOL, KfbotError

# Torch's ninja writer reads module globals and the environment; one call at a time.
_TORCH_LOCK = threading.Lock()
_NINJA_WRITER = "_write_ninja_file_to_build_library"
_LDFLAGS_HELPER = "_prepare_ldflags"
# The variables of torch's build.ninja that the builder needs.
_VARIABLES = (
    "cxx",
    "nvcc",
    "cflags",
    "post_cflags",
    "cuda_cflags",
    "cuda_post_cflags",
    "cuda_dlink_post_cflags",
    "ldflags",
)
# Asks for the compute capability in a child process, so that this process never
# creates a CUDA context (forking worker processes after that is unsafe).
_CAPABILITY_PROBE = (
    "import torch\n"
    "if torch.cuda.is_available():\n"
    "    print('%d%d' % torch.cuda.get_device_capability(0))\n"
)


@dataclass(frozen=True)
class FlagRequest:
    """What torch's flags depend on, hashable so that each set is asked for once."""

    name: str  # the TORCH_EXTENSION_NAME the objects are compiled with
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    include_dirs: tuple[str, ...]  # absolute paths, as torch wants them
    with_cuda: bool
    arch_list: str  # a TORCH_CUDA_ARCH_LIST value, e.g. "9.0"
    cuda_home: str


@dataclass(frozen=True)
class TorchFlags:
    """The command pieces torch's build.ninja holds, split into arguments."""

    cxx: tuple[str, ...]
    nvcc: tuple[str, ...]
    cflags: tuple[str, ...]
    post_cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    cuda_post_cflags: tuple[str, ...]
    cuda_dlink_post_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]


def require_torch() -> None:
    """Fail with one line when torch is not installed (without importing it)."""
    if importlib.util.find_spec("torch") is None:
        raise KfbotError(
            "torch is not installed in this Python "
            f"({sys.executable}): install a CUDA build of PyTorch to build "
            "extensions",
            EXIT_MISSING_TOOL,
        )


def _cpp_extension() -> ModuleType:
    require_torch()
    try:
        return importlib.import_module("torch.utils.cpp_extension")
    except Exception as exc:  # a broken install raises anything at import time
        raise KfbotError(
            f"torch could not be imported ({type(exc).__name__}: {exc})", EXIT_MISSING_TOOL
        ) from exc


def torch_flags(request: FlagRequest) -> TorchFlags:
    """torch's compile and link flags for `request`, computed once per process."""
    with _TORCH_LOCK:
        return _torch_flags(request, tuple(sorted(flag_environment().items())))


@cache
def _torch_flags(request: FlagRequest, environment: tuple[tuple[str, str], ...]) -> TorchFlags:
    del environment  # only part of the cache key: torch reads os.environ itself
    module = _cpp_extension()
    with tempfile.TemporaryDirectory(prefix="kfbot-ninja-") as tmp, _patched(module, request):
        path = os.path.join(tmp, "build.ninja")
        ldflags = _call(
            module,
            _LDFLAGS_HELPER,
            extra_ldflags=[],
            with_cuda=request.with_cuda,
            with_sycl=False,
            verbose=False,
            is_standalone=False,
        )
        _call(
            module,
            _NINJA_WRITER,
            path=path,
            name=request.name,
            sources=_placeholder_sources(tmp, request.with_cuda),
            extra_cflags=list(request.extra_cflags),
            extra_cuda_cflags=list(request.extra_cuda_cflags),
            extra_sycl_cflags=[],
            extra_ldflags=ldflags,
            extra_include_paths=list(request.include_dirs),
            with_cuda=request.with_cuda,
            with_sycl=False,
            is_standalone=False,
        )
        text = Path(path).read_text(encoding="utf-8")
    return _parse_ninja(text)


def _placeholder_sources(tmp: str, with_cuda: bool) -> list[str]:
    # The writer needs sources to name the objects; they are never read.
    names = ["kfbot_flags.cpp", "kfbot_flags.cu"] if with_cuda else ["kfbot_flags.cpp"]
    return [os.path.join(tmp, name) for name in names]


@contextmanager
def _patched(module: ModuleType, request: FlagRequest) -> Iterator[None]:
    """Point torch at our toolkit and arch list for the duration of one call.

    A CPU build of torch sets CUDA_HOME to None, which makes every CUDA flag fail;
    a CUDA build may have guessed another toolkit than the nvcc we checked.
    """
    saved_home = getattr(module, "CUDA_HOME", None)
    saved_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    setattr(module, "CUDA_HOME", request.cuda_home)  # noqa: B010 (a module global)
    os.environ["TORCH_CUDA_ARCH_LIST"] = request.arch_list
    try:
        yield
    finally:
        setattr(module, "CUDA_HOME", saved_home)  # noqa: B010
        if saved_arch is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved_arch


def _call(module: ModuleType, helper: str, /, **known: Any) -> Any:
    """Call a private torch helper with the keyword arguments its signature takes.

    Private helpers gain and lose parameters between releases; unknown required
    parameters mean torch changed in a way this code cannot guess.
    """
    function: Callable[..., Any] | None = getattr(module, helper, None)
    if function is None:
        raise _changed(helper, "it no longer exists")
    parameters = inspect.signature(function).parameters
    missing = [
        p.name
        for p in parameters.values()
        if p.default is inspect.Parameter.empty
        and p.name not in known
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if missing:
        raise _changed(helper, f"it now needs {', '.join(missing)}")
    try:
        return function(**{k: v for k, v in known.items() if k in parameters})
    except Exception as exc:
        raise KfbotError(
            f"torch could not compute extension build flags in {helper} "
            f"({type(exc).__name__}: {exc})",
            EXIT_MISSING_TOOL,
        ) from exc


def _changed(name: str, why: str) -> KfbotError:
    return KfbotError(
        f"this torch ({torch_version()}) changed its private "
        f"torch.utils.cpp_extension.{name} ({why}); kfbot cannot read its "
        "build flags",
        EXIT_MISSING_TOOL,
    )


@cache
def torch_version() -> str:
    """torch's version and install folder, read without importing torch.

    Part of every object key: objects built against other torch headers never match.
    """
    spec = importlib.util.find_spec("torch")
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version} {spec.origin if spec is not None else ''}"


def _parse_ninja(text: str) -> TorchFlags:
    values = parse_ninja_variables(text)
    if "cxx" not in values or "cflags" not in values or "ldflags" not in values:
        raise _changed(_NINJA_WRITER, "its build.ninja lacks cxx, cflags or ldflags")
    split = {name: tuple(shlex.split(values.get(name, ""))) for name in _VARIABLES}
    return TorchFlags(**split)


def parse_ninja_variables(text: str) -> dict[str, str]:
    """Top-level `name = value` lines of a ninja file (rule bodies are indented)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line[0].isspace() or (" = " not in line and not line.endswith(" =")):
            continue
        name, _, value = line.partition("=")
        if name.strip().isidentifier():
            found[name.strip()] = value.strip()
    return found


def torch_lib_dir() -> Path:
    """torch's `lib` folder (libtorch*.so), found without importing torch."""
    require_torch()
    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None else None
    if origin is None:
        raise KfbotError("torch's install folder could not be found", EXIT_MISSING_TOOL)
    return Path(origin).parent / "lib"


def has_cuda_libraries() -> bool:
    """Whether this torch can link CUDA extensions (a CPU build lacks these)."""
    lib = torch_lib_dir()
    return (lib / "libtorch_cuda.so").exists() and (lib / "libc10_cuda.so").exists()


def visible_gpu_arch(timeout_s: float = 120.0) -> str | None:
    """The first visible GPU's compute capability as "90", or None without one."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CAPABILITY_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    answer = done.stdout.strip().splitlines()
    return answer[-1] if done.returncode == 0 and answer and answer[-1].isdigit() else None


def flag_environment() -> Mapping[str, str]:
    """Environment variables torch's flags depend on, for cache keys."""
    names = (
        "CC",
        "CXX",
        "PYTORCH_NVCC",
        "TORCH_NO_COMPILER_WRAPPER",
        "CUDA_INC_PATH",
        "CUDNN_HOME",
        "CUDNN_PATH",
    )
    return {name: os.environ[name] for name in names if name in os.environ}
