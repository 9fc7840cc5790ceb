"""The light hook's compile check without nvcc: the front-end command built from a build
recipe, nvcc's output read into files and lines, what is excused, and torch's headers
found without importing torch (kfbot.commands.compile_check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kfbot.commands.compile_check import (
    compile_result,
    excused,
    front_end_flags,
    nvcc_command,
    torch_include_dirs,
)
from kfbot.scan.model import BuildRecipe


def test_the_front_end_command_takes_the_builds_parse_flags() -> None:
    recipe = BuildRecipe(kind="load", name="ext", file="ops.py", line=3,
                         sources=("csrc/a.cu",), defines=(("BLOCK", "256"), ("FAST", "")),
                         extra_cuda_cflags=("-O3", "-gencode", "arch=compute_80,code=sm_80",
                                            "--use_fast_math", "-std=c++20", "-Xptxas", "-v"),
                         include_dirs=("include",))
    command = nvcc_command("nvcc", "csrc/a.cu", recipe)
    assert command[:3] == ["nvcc", "-cubin", "-fdevice-syntax-only"]
    assert command[-3:] == ["-o", os.devnull, "./csrc/a.cu"]  # never read as an option
    flags = command[3:-3]
    assert {"-Iinclude", "-DBLOCK=256", "-DFAST", "--use_fast_math", "-std=c++20",
            "--expt-relaxed-constexpr"} <= set(flags)
    assert "-std=c++17" not in flags and "-O3" not in flags and "-gencode" not in flags
    assert front_end_flags(["-I", "inc", "-rdc=true", "-include", "pre.h"]) == \
        ["-I", "inc", "-include", "pre.h"]


def test_compile_output_is_read_into_file_and_line() -> None:
    output = ('csrc/a.cu(16): error: expected a ";"\n      for (;;) x;\n      ^\n\n'
              '1 error detected in the compilation of "csrc/a.cu".\n')
    result = compile_result("csrc/a.cu", 1, output, 0.3)
    assert [(d.file, d.line, d.message) for d in result.errors] == \
        [("csrc/a.cu", 16, 'expected a ";"')]
    torch = compile_result("csrc/b.cu", 1, "csrc/b.cu:1:10: fatal error: ATen/ATen.h: No such "
                           "file or directory\ncompilation terminated.\n", 0.1)
    assert (torch.errors, torch.skipped is not None) == ((), True)
    assert "ATen/ATen.h" in (torch.skipped or "")
    # A failure that names no line is no evidence against the change: not checked.
    silent = compile_result("csrc/c.cu", 2, "", 0.1)
    assert (silent.errors, silent.skipped) == \
        ((), "nvcc stopped without naming a line (exit 2: no message)")
    fatal = compile_result("csrc/c.cu", 1, "nvcc fatal   : Unsupported gpu architecture "
                           "'sm_990'\n", 0.1)
    assert (fatal.errors, fatal.skipped) == ((), "nvcc stopped without naming a line (exit 1: "
                                             "Unsupported gpu architecture 'sm_990')")


def test_a_header_the_committed_version_could_not_find_either_is_excused() -> None:
    output = ("csrc/a.cu:2:10: fatal error: cutlass/cutlass.h: No such file or directory\n"
              "compilation terminated.\n")
    result = compile_result("csrc/a.cu", 1, output, 0.1)
    assert result.missing_header == "cutlass/cutlass.h" and result.errors
    old = b"#include <cuda.h>\n#include <cutlass/cutlass.h>\n"
    (kept,) = excused([result], {"csrc/a.cu": old})
    assert (kept.errors, kept.skipped) == ((), "nvcc cannot find cutlass/cutlass.h here, which "
                                           "the committed version includes too")
    # The change wrote the include (or the file is new): its error stands.
    assert excused([result], {"csrc/a.cu": b"#include <cuda.h>\n"}) == [result]
    assert excused([result], {"csrc/a.cu": None}) == [result]


def test_torch_headers_are_found_without_importing_torch() -> None:
    code = ("import sys\nfrom kfbot.commands.compile_check import torch_include_dirs\n"
            "print(torch_include_dirs() is not None, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    found, imported = done.stdout.split()
    assert imported == "False"
    dirs = torch_include_dirs()
    if found == "True":
        assert dirs is not None and (Path(dirs[0]) / "torch" / "extension.h").is_file()
        command = nvcc_command("nvcc", "csrc/a.cu", None, dirs)
        assert f"-I{dirs[0]}" in command and "-DTORCH_API_INCLUDE_EXTENSION_H" in command
    else:
        assert dirs is None
