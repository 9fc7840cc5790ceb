"""The CUDA toolkit and the target architectures a build compiles for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.errors import EXIT_MISSING_TOOL, EXIT_USAGE, KfbotError
from kfbot.evaluate.build import cpp_extension

DEFAULT_ARCH = "90"
_ARCH = re.compile(r"^(?:sm_|compute_)?(?P<major>\d+)(?P<minor>\d)(?P<suffix>[a-z]?)$")


def arch_list(arch: str) -> str:
    """A TORCH_CUDA_ARCH_LIST entry: "90" and "sm_90" -> "9.0", "90a" -> "9.0a"."""
    text = arch.strip()
    if re.fullmatch(r"\d+\.\d[a-z]?(\+PTX)?", text):
        return text
    match = _ARCH.match(text)
    if match is None:
        raise KfbotError(
            f"unknown CUDA architecture {arch!r}: expected e.g. 90 or sm_90a", EXIT_USAGE
        )
    return f"{match['major']}.{match['minor']}{match['suffix']}"


def _may_have_gpu() -> bool:
    # Saves a torch import in a child process on machines that have no NVIDIA driver.
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidiactl")


def default_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST if set, else the visible GPU's, else sm_90."""
    configured = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if configured and configured != "native":
        return configured
    found = cpp_extension.visible_gpu_arch() if _may_have_gpu() else None
    return arch_list(found or DEFAULT_ARCH)


@dataclass(frozen=True)
class Toolkit:
    nvcc: str
    cuda_home: str


def find_toolkit() -> Toolkit:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH; one line when there is none."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(variable)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return Toolkit(os.path.join(home, "bin", "nvcc"), home)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise KfbotError(
            "nvcc not found: put the CUDA toolkit's bin folder on PATH or set CUDA_HOME",
            EXIT_MISSING_TOOL,
        )
    return Toolkit(nvcc, _cuda_home(nvcc))


def _cuda_home(nvcc: str) -> str:
    """The toolkit folder holding include/cuda_runtime.h, also behind wrapper scripts."""
    home = Path(nvcc).resolve().parent.parent
    if (home / "include" / "cuda_runtime.h").exists():
        return str(home)
    try:
        # Lists the steps it would run, starting with its own folder; runs nothing.
        dry = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return str(home)
    for line in (dry.stdout + dry.stderr).splitlines():
        if line.startswith("#$ _HERE_="):  # nvcc's own bin folder
            return str(Path(line.split("=", 1)[1].strip()).parent)
    return str(home)


def require_compiler(command: Sequence[str]) -> None:
    if not command or shutil.which(command[0]) is None:
        shown = " ".join(command) or "(none)"
        raise KfbotError(
            f"C++ compiler not found: {shown} (set CXX or install g++)", EXIT_MISSING_TOOL
        )

