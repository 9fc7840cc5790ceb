"""setup.py as people write it: flags from helpers and loops, conditions the scan can
decide or must say it cannot, globs matched against the repository, and commands the
scan never runs."""

from __future__ import annotations

from pathlib import Path

from kfbot.config import Config
from kfbot.scan.python.facts import extract_python_facts
from kfbot.scan.scanner import scan

SETUP = b"""\
import os
import subprocess
from torch.utils.cpp_extension import CUDAExtension, CppExtension, CUDA_HOME

def cuda_version():
    out = subprocess.check_output(["nvcc", "-V"], text=True)
    return out.split("release ")[1][:4]

version = cuda_version()
cc_flag = ["-O3"]
if CUDA_HOME is not None:
    cc_flag.append("--expt-relaxed-constexpr")
if version >= "12.8":
    cc_flag += ["-gencode", "arch=compute_100,code=sm_100"]
if os.environ.get("USE_ROCM"):
    cc_flag.append("-DROCM")

def threads(args):
    return args + ["--threads", "4"]

def extension():
    Ext = CUDAExtension if CUDA_HOME else CppExtension
    return Ext("ops", ["csrc/a.cpp"] + [os.path.join("kernels", f) for f in
                                        os.listdir("kernels") if f.endswith(".cu")],
               extra_compile_args={"nvcc": threads(cc_flag + ["-U__CUDA_NO_HALF_OPERATORS__"])})

ext_modules = [extension()]
"""


def test_flags_are_kept_and_what_cannot_be_told_is_said() -> None:
    facts = extract_python_facts("setup.py", SETUP)
    (build,) = facts.builds
    assert build.extra_cuda_cflags == (
        "-O3", "--expt-relaxed-constexpr", "-gencode", "arch=compute_100,code=sm_100",
        "-U__CUDA_NO_HALF_OPERATORS__", "--threads", "4")
    assert build.sources == ("csrc/a.cpp", "kernels/*.cu")  # matched against the files later
    notes = "\n".join(build.cannot_tell)
    assert "setup.py:11: `CUDA_HOME is not None`: taken as true" in notes
    assert "setup.py:13: `version >= '12.8'` cannot be told statically" in notes
    assert "setup.py:15: `os.environ.get('USE_ROCM')`: taken as false" in notes
    assert "`Ext = CUDAExtension if CUDA_HOME else CppExtension` (line 22)" in notes
    (runs,) = [p for p in facts.problems if "running this file runs" in p.message]
    assert (runs.line, runs.severity) == (6, "warning")
    assert "subprocess.check_output" in runs.message


def test_a_glob_that_matches_nothing_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cpp").write_text("void f() {}\n")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cu").write_text(
        "__global__ void k(float* x) {}\nvoid run(float* x) { k<<<1, 1>>>(x); }\n")
    (tmp_path / "setup.py").write_bytes(SETUP.replace(b'f.endswith(".cu")',
                                                      b'f.endswith(".cuh")'))
    report = scan(tmp_path, Config())
    (glob,) = [p for p in report.problems if "glob" in p.message]
    assert (glob.file, glob.line, glob.severity) == ("setup.py", 23, "warning")
    assert glob.message == "the source glob `kernels/*.cuh` matches no file of the repository"
    (setup,) = report.kernels[0].builds if report.kernels[0].builds else (None,)
    assert setup is None  # k.cu is in no build: the glob that would have held it matched nothing

    (tmp_path / "setup.py").write_bytes(SETUP)
    (kernel,) = scan(tmp_path, Config()).kernels
    (build,) = kernel.builds
    assert build.sources == ("csrc/a.cpp", "kernels/k.cu")
