"""`kfbot scan` from the command line: formats, exit codes and messages on bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kfbot.cli import main
from kfbot.config import Config
from kfbot.scan.forked import Forked
from kfbot.scan.scanner import scan
from kfbot.scan.show import render
from kfbot.scan.show.json_text import JsonText, dumps_indented

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
SCHEMA = json.loads((ROOT / "kfbot" / "schemas" / "scan-v1.json").read_text())

KERNEL = """\
__global__ void {name}(float* x, int n) {{ int i = threadIdx.x; if (i < n) x[i] = 0; }}
void launch_{name}(float* x, int n) {{ {name}<<<1, 128>>>(x, n); }}
"""


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _repo(tmp_path: Path, **files: str) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_json_output_matches_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "scan", str(FIXTURES / "example"), "--json")
    assert code == 0
    report = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    assert report["schema_version"] == 1
    assert {k["name"] for k in report["kernels"]} >= {"softmax_kernel"}
    for kernel in report["kernels"]:
        assert {"name", "file", "line", "references"} <= kernel.keys()
        assert all("file" in ref for ref in kernel["references"])


def test_table_and_markdown_name_every_kernel(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"a.cu": KERNEL.format(name="alpha_kernel"),
                              "b.cu": KERNEL.format(name="beta_kernel")})
    code, out, _ = _run(capsys, "scan", str(repo))
    assert code == 0 and "alpha_kernel" in out and "beta_kernel" in out
    assert "NO REFERENCE TEST" in out
    code, out, _ = _run(capsys, "scan", str(repo), "--format", "markdown")
    assert code == 0
    assert out.startswith("# kfbot scan: 2 kernels")
    assert "| alpha_kernel | `a.cu:1` |" in out


def test_missing_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "scan", str(tmp_path / "nope"))
    assert code == 2
    assert f"kfbot: error: {tmp_path / 'nope'}: no such file or directory" in err


def test_file_instead_of_repository(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("int x;")
    code, _, err = _run(capsys, "scan", str(tmp_path / "k.cu"))
    assert code == 2 and "is a file; kfbot scans a repository folder" in err


def test_no_kernels_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _repo(tmp_path, **{"src__main.py": "print('hi')\n", "src__util.cpp": "int f() { return 1; }"})
    code, _, err = _run(capsys, "scan", str(tmp_path))
    assert code == 1
    assert "no CUDA kernels found" in err and "2 source files scanned" in err


def test_unknown_kernel_lists_close_matches(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"a.cu": KERNEL.format(name="softmax_kernel")})
    code, _, err = _run(capsys, "scan", str(repo), "--kernel", "softmax_kernal")
    assert code == 2
    assert "unknown kernel 'softmax_kernal'; close matches: softmax_kernel" in err


def test_ambiguous_kernel_lists_the_ids(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"a__k.cu": KERNEL.format(name="dup"),
                              "b__k.cu": KERNEL.format(name="dup")})
    code, _, err = _run(capsys, "scan", str(repo), "--kernel", "dup")
    assert code == 2
    assert "kernel 'dup' is ambiguous" in err and "a/k.cu::dup" in err and "b/k.cu::dup" in err
    code, out, _ = _run(capsys, "scan", str(repo), "--kernel", "b/k.cu::dup", "--json")
    assert code == 0
    assert [k["id"] for k in json.loads(out)["kernels"]] == ["b/k.cu::dup"]


def test_bad_config_names_file_line_and_key(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"a.cu": KERNEL.format(name="k"),
                              "kfbot.yaml": "version: 1\nscan:\n  exclud: []\n"})
    code, _, err = _run(capsys, "scan", str(repo))
    assert code == 2
    assert "kfbot.yaml:3: scan.exclud: unknown key" in err


def test_declared_task_with_unknown_kernel(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"a.cu": KERNEL.format(name="square_kernel"),
                              "kfbot.yaml": "tasks:\n  - name: sq\n    kernel: sqare_kernel\n"})
    code, _, err = _run(capsys, "scan", str(repo))
    assert code == 2
    assert "kfbot.yaml:2: task 'sq': unknown kernel 'sqare_kernel'" in err
    assert "close matches: square_kernel" in err


def test_scan_never_imports_torch() -> None:
    code = ("import sys; from kfbot.cli import main; "
            f"main(['scan', {str(FIXTURES / 'example')!r}, '--json']); "
            "sys.stderr.write('torch' in sys.modules and 'TORCH' or 'NOTORCH')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stderr.endswith("NOTORCH")


def test_scan_imports_neither_the_evaluation_engine_nor_rich_for_json() -> None:
    """Start-up is part of every scan: what a JSON scan does not use is not imported."""
    code = ("import sys; from kfbot.cli import main; "
            f"main(['scan', {str(FIXTURES / 'example')!r}, '--json']); "
            "sys.stderr.write(repr(sorted(m for m in sys.modules "
            "if m.startswith(('kfbot.evaluate', 'rich')))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stderr.endswith("[]")


def test_console_script_runs(tmp_path: Path) -> None:
    repo = _repo(tmp_path, **{"a.cu": KERNEL.format(name="k")})
    result = subprocess.run([sys.executable, "-m", "kfbot", "scan", str(repo), "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kernels"][0]["id"] == "a.cu::k"


TRICKY = {
    "text": ["plain", "é ünïcode ☃", "quote \" and \\ back", "line\nbreak\ttab\x00nul", ""],
    "numbers": [0, -1, 10**20, 1.5, 1e-7, float("inf"), float("-inf"), float("nan")],
    "scalars": [True, False, None],
    "empty": [[], {}, (), [[]], [{}], {"a": []}],
    "nested": {"a": {"b": [1, [2, [3, {"c": ("d", "e")}]]]}, "": {"k": "v"}},
    "records": [{"name": "x", "line": 3, "values": ["1", "2"]}, {"name": "y", "values": []}],
    "keys": {7: "int", 2.5: "float", True: "bool", None: "none"},
}


@pytest.mark.parametrize("indent", [1, 2, 4])
@pytest.mark.parametrize("value", [TRICKY, *TRICKY.values(), [], {}, "s", 7, None, [TRICKY]])
def test_indented_json_is_what_json_dumps_writes(value: object, indent: int) -> None:
    assert dumps_indented(value, indent=indent) == json.dumps(value, indent=indent)


def test_indented_json_for_a_deeper_place_and_inserted_text() -> None:
    inner = dumps_indented(TRICKY, depth=2)
    outer = dumps_indented({"list": [JsonText(inner)], "after": 1})
    assert outer == json.dumps({"list": [TRICKY], "after": 1}, indent=1)


@pytest.mark.parametrize("fork_from", [1, 2, 10**9])
def test_json_report_is_the_same_written_by_one_process_or_two(
        fork_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    report = scan(FIXTURES / "tunables_matmul", Config())
    assert len(report.kernels) >= 2
    monkeypatch.setattr(render, "FORK_KERNELS", fork_from)
    assert render.json_text(report) == json.dumps(render.to_json(report), indent=1)
    empty = dataclasses.replace(report, kernels=())
    assert render.json_text(empty) == json.dumps(render.to_json(empty), indent=1)


def test_forked_work_falls_back_to_this_process_when_the_child_fails() -> None:
    parent = os.getpid()

    def work() -> str:
        if os.getpid() != parent:
            raise RuntimeError("fails in the child only")
        return "done here"

    with Forked(work) as child:
        assert child.result() == "done here"


def test_forked_child_is_stopped_when_its_result_is_not_asked_for() -> None:
    with Forked(lambda: "x" * 10**7) as child:  # more than a pipe holds: it blocks
        pid = child._pid
    assert pid is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped
