"""Tables that fit: at 80 columns the scan and lessons reports are lists whose names
and locations are never split across lines; from 120 columns they are tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.cli import main
from kfbot.search.experience import Lesson, append_lessons

ROOT = Path(__file__).resolve().parents[2]
LONG_KERNEL = "fused_attention_forward_with_rotary_embedding_kernel"
LONG_FILE = "csrc/attention/a_rather_long_folder_name/fused_attention_forward.cu"
KERNEL = """\
__global__ void {name}(float* x, int n) {{ int i = threadIdx.x; if (i < n) x[i] = 0; }}
void launch_{name}(float* x, int n) {{ {name}<<<1, 128>>>(x, n); }}
"""


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int,
        *args: str) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(args)) == 0
    return capsys.readouterr().out.splitlines()


def whole(text: str, lines: list[str]) -> bool:
    return any(text in line for line in lines)


def fits(lines: list[str], width: int) -> bool:
    """Every line fits, but one that holds a single token longer than the width."""
    return all(len(line) <= width or " " not in line.strip() or
               any(len(word) > width - 20 for word in line.split()) for line in lines)


def test_the_scan_at_80_columns_splits_no_name(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    (tmp_path / LONG_FILE).parent.mkdir(parents=True)
    (tmp_path / LONG_FILE).write_text(KERNEL.format(name=LONG_KERNEL))
    (tmp_path / "csrc" / "matmul.cu").write_text(KERNEL.format(name="matmul_kernel"))
    lines = run(capsys, monkeypatch, 80, "scan", "--repo", str(tmp_path))
    for text in (LONG_KERNEL, f"{LONG_FILE}:1", f"launch_{LONG_KERNEL}", "matmul_kernel",
                 "csrc/matmul.cu:1", "NO REFERENCE TEST"):
        assert whole(text, lines), text
    assert fits(lines, 80), "\n".join(lines)
    assert not any("│" in line for line in lines)
    # 200 columns hold no table whose every word fits: still a list, nothing split
    wide = run(capsys, monkeypatch, 200, "scan", "--repo", str(tmp_path))
    assert whole(f"launch_{LONG_KERNEL}", wide) and whole(f"{LONG_FILE}:1", wide)
    table = run(capsys, monkeypatch, 200, "scan", "--repo", str(ROOT / "fixtures" / "example"))
    assert any("│ softmax_kernel " in line and "│ csrc/softmax.cu:8 " in line for line in table)


def test_the_lessons_at_80_columns_split_no_name(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    kernel = f"{LONG_FILE}::{LONG_KERNEL}"
    path = tmp_path / "experience.md"
    append_lessons(path, [Lesson(kernel, "NVIDIA H200", "vectorized float4 loads and stores "
                                 "in the inner loop of the row reduction", "rules", "faster",
                                 1.42, None, "", "2026-11-20")])
    lines = run(capsys, monkeypatch, 80, "lessons", "--file", str(path))
    for text in (kernel, "NVIDIA H200", "1.420x faster", "2026-11-20"):
        assert whole(text, lines), text
    assert fits(lines, 80), "\n".join(lines)
    wide = run(capsys, monkeypatch, 250, "lessons", "--file", str(path))
    assert any("│" in line and f"│ {kernel} " in line for line in wide)
