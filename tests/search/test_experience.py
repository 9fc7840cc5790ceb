"""The experience file: its format, idempotent appends, foreign text, ranking and the CLI."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.errors import KfbotError
from kfbot.search.experience import (
    HEADER,
    Lesson,
    append_lessons,
    read_lessons,
    relevant,
    render_lesson,
)

ROOT = Path(__file__).resolve().parents[2]
SOFTMAX = "csrc/softmax.cu::softmax_kernel"
GEMM = "csrc/gemm.cu::gemm_kernel"
NORM = "csrc/norm.cu::layernorm_kernel"
H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"


def win(kernel: str = SOFTMAX, gpu: str = H200, change: str = "rules: vectorized float4 loads",
        speedup: float = 1.84, date: str = "2025-01-02",
        tags: tuple[str, ...] = ("memory-bound",), outcome: str = "faster") -> Lesson:
    return Lesson(kernel, gpu, change, "rules", outcome, speedup, None, "", date, tags)  # type: ignore[arg-type]


def fail(kernel: str = SOFTMAX, gpu: str = H200, change: str = "llm: warp-per-row rewrite",
         stage: str = "correctness", date: str = "2025-01-03",
         tags: tuple[str, ...] = ()) -> Lesson:
    return Lesson(kernel, gpu, change, "llm", "failed", None, stage,
                  "max abs error 3.2e-2 on rows of 4097", date, tags)


LESSONS = [
    win(),
    fail(),
    win(GEMM, change="params: BLOCK_M=128", speedup=1.2, tags=("compute-bound", "shared-tiling")),
    win(NORM, gpu=H100, change="params: 256 threads", speedup=0.97, outcome="noise"),
    win(NORM, change="rules: fuse the two passes", speedup=0.8, outcome="slower"),
    fail(GEMM, stage="build", change="llm: wmma tensor cores", tags=("tensor-core",)),
]


def test_render_is_a_heading_and_fixed_key_lines() -> None:
    assert render_lesson(win()) == (
        f"### Lesson: {SOFTMAX} on {H200}, 1.840x faster\n"
        f"- kernel: {SOFTMAX}\n"
        f"- gpu: {H200}\n"
        "- change: rules: vectorized float4 loads\n"
        "- origin: rules\n"
        "- outcome: faster\n"
        "- speedup: 1.840\n"
        "- stage: -\n"
        "- reason: -\n"
        "- date: 2025-01-02\n"
        "- tags: memory-bound\n")


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "deep" / ".kfbot" / "experience.md"
    assert read_lessons(path) == []
    assert append_lessons(path, LESSONS) == len(LESSONS)
    assert path.read_text().startswith(HEADER)
    assert sorted(read_lessons(path), key=repr) == sorted(LESSONS, key=repr)


def test_lessons_are_normalised_to_what_reads_back(tmp_path: Path) -> None:
    odd = Lesson(SOFTMAX, " NVIDIA  H200 ", "rules:\n two\tlines", "rules", "faster", 1.23456,
                 None, "-", "2025-01-02", ("b", "a, c", "a", "shared tiling"))
    assert (odd.gpu, odd.change, odd.speedup, odd.reason) == (H200, "rules: two lines", 1.235, "")
    assert odd.tags == ("a", "b", "c", "shared-tiling")
    path = tmp_path / "e.md"
    append_lessons(path, [odd])
    assert read_lessons(path) == [odd]


@pytest.mark.parametrize("fields, problem", [
    ({"outcome": "failed"}, "a failed lesson has no speedup"),
    ({"speedup": None}, "needs a positive speedup"),
    ({"stage": "build"}, "has no stage"),
    ({"origin": "magic"}, "origin 'magic' is not one of"),
    ({"date": "2025-02-30"}, "not a calendar date"),
    ({"change": " "}, "change is empty"),
])
def test_inconsistent_lessons_are_refused(fields: dict[str, object], problem: str) -> None:
    base = {"kernel": SOFTMAX, "gpu": H200, "change": "c", "origin": "rules",
            "outcome": "faster", "speedup": 1.5, "stage": None, "reason": "", "date": "2025-01-02"}
    with pytest.raises(ValueError, match=problem):
        Lesson(**{**base, **fields})  # type: ignore[arg-type]


def test_append_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "experience.md"
    append_lessons(path, LESSONS)
    first = path.read_bytes()
    assert append_lessons(path, LESSONS) == 0
    assert append_lessons(path, list(reversed(LESSONS))) == 0
    assert path.read_bytes() == first
    assert len(read_lessons(path)) == len(LESSONS)


def test_written_read_and_written_again_is_byte_identical(tmp_path: Path) -> None:
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    append_lessons(a, LESSONS)
    append_lessons(b, read_lessons(a))
    assert b.read_bytes() == a.read_bytes()
    before = a.stat().st_mtime_ns
    assert append_lessons(a, read_lessons(a)) == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_mtime_ns == before  # an unchanged file is not written


def test_order_does_not_depend_on_the_order_appended(tmp_path: Path) -> None:
    texts = set()
    for seed in range(6):
        shuffled = LESSONS[:]
        random.Random(seed).shuffle(shuffled)
        path = tmp_path / f"{seed}.md"
        for lesson in shuffled:  # one at a time, as runs append them
            append_lessons(path, [lesson])
        texts.add(path.read_text())
    assert len(texts) == 1
    keys = [(x.kernel, x.gpu, x.change) for x in read_lessons(tmp_path / "0.md")]
    assert keys == sorted(keys)


def test_same_lesson_is_replaced_only_by_a_later_one(tmp_path: Path) -> None:
    path = tmp_path / "e.md"
    append_lessons(path, [win(speedup=1.8, date="2025-01-05")])
    assert append_lessons(path, [win(speedup=1.9, date="2025-01-04")]) == 0
    assert [x.speedup for x in read_lessons(path)] == [1.8]
    assert append_lessons(path, [win(speedup=1.7, date="2025-01-06")]) == 0
    assert [(x.speedup, x.date) for x in read_lessons(path)] == [(1.7, "2025-01-06")]
    # Another outcome of the same change is another lesson.
    assert append_lessons(path, [win(speedup=1.01, outcome="noise")]) == 1
    assert len(read_lessons(path)) == 2


def test_hand_written_text_is_kept_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "e.md"
    intro = ("# Our kernels' experience\n\nWritten by hand, *not* kfbot's header.\n"
             "### A heading of ours\n- kernel: not a lesson, no Lesson heading\n")
    note = ("> Note (alice): the float4 win needs 16-byte aligned rows;\n"
            ">   check `x.data_ptr() % 16` before trusting it.\n\n  indented   spacing kept  \n")
    path.write_text(intro + "\n" + render_lesson(win()) + "\n" + note + "\n"
                    + render_lesson(win(GEMM)) + "\nTrailing notes at the very end.\n")
    append_lessons(path, [fail(), win(NORM), win(GEMM, change="a")])
    text = path.read_text()
    assert text.startswith(intro)
    assert HEADER not in text
    # The note stays right after its lesson; the lesson sorted after it moved up past it.
    assert render_lesson(win()) + "\n" + note in text
    assert render_lesson(win(GEMM)) + "\nTrailing notes at the very end.\n" in text
    assert len(read_lessons(path)) == 5
    again = path.read_bytes()
    assert append_lessons(path, read_lessons(path)) == 0
    assert path.read_bytes() == again


def test_a_file_of_notes_only_keeps_them_and_gets_no_header(tmp_path: Path) -> None:
    path = tmp_path / "e.md"
    path.write_text("Just notes.\n")
    append_lessons(path, [win()])
    assert path.read_text() == "Just notes.\n\n" + render_lesson(win())


@pytest.mark.parametrize("edit, line, problem", [
    (lambda t: t.replace("- gpu: NVIDIA H200\n", "", 1), 3, "expected '- gpu: ...'"),
    (lambda t: t.replace("- speedup: 1.840", "- speedup: fast", 1), 7, "bad speedup"),
    (lambda t: t.replace("- outcome: faster", "- outcome: better", 1), 6, "bad outcome"),
    (lambda t: t.replace("- date: 2025-01-02", "- date: 2/1/2025", 1), 10, "bad date"),
    (lambda t: t.rsplit("- tags:", 1)[0], 11, "found the end of the lesson"),
])
def test_a_malformed_block_names_file_line_and_problem(tmp_path: Path, edit: object,
                                                       line: int, problem: str) -> None:
    path = tmp_path / "e.md"
    path.write_text(render_lesson(win()))
    assert callable(edit)
    path.write_text(edit(path.read_text()))
    with pytest.raises(KfbotError, match=problem) as info:
        read_lessons(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    with pytest.raises(KfbotError):
        append_lessons(path, [fail()])
    assert path.read_text() == edit(render_lesson(win()))  # never rewritten


def test_relevant_ranks_kernel_then_gpu_and_tags_then_the_rest() -> None:
    mine_fail = fail(SOFTMAX)
    mine_win_other_gpu = win(SOFTMAX, gpu=H100, change="a", speedup=1.1)
    mine_win = win(SOFTMAX, change="b", speedup=1.5)
    gpu_and_tag = win(GEMM, tags=("memory-bound",), speedup=1.3)
    gpu_and_tag_fail = fail(NORM, tags=("memory-bound",))
    gpu_only = win(NORM, change="c", tags=("compute-bound",))
    tag_only = win(GEMM, gpu=H100, change="d", tags=("memory-bound",))
    other = win(NORM, gpu=H100, change="e", tags=())
    every = [other, tag_only, gpu_only, gpu_and_tag_fail, gpu_and_tag, mine_win,
             mine_win_other_gpu, mine_fail]
    expected = [mine_win, mine_win_other_gpu, mine_fail, gpu_and_tag, gpu_and_tag_fail,
                gpu_only, tag_only, other]
    for seed in range(5):
        random.Random(seed).shuffle(every)
        assert relevant(every, SOFTMAX, H200, ["memory-bound"]) == expected
    assert relevant(every, SOFTMAX, H200, ["memory-bound"], limit=2) == expected[:2]
    assert relevant([], SOFTMAX, H200) == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}  # a table wide enough not to fold a cell
    return subprocess.run([sys.executable, "-m", "kfbot", "lessons", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_table_and_json(tmp_path: Path) -> None:
    path = tmp_path / "experience.md"
    append_lessons(path, LESSONS)
    table = _cli("--file", str(path))
    assert table.returncode == 0, table.stderr
    for text in (SOFTMAX, "1.840x faster", "failed at correctness", "2025-01-03", H200):
        assert text in table.stdout
    result = _cli("--file", str(path), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data) == len(LESSONS)
    assert [Lesson(**{**x, "tags": tuple(x["tags"])}) for x in data] == read_lessons(path)
    only = json.loads(_cli("--file", str(path), "--json", "--kernel", "gemm_kernel").stdout)
    assert {x["kernel"] for x in only} == {GEMM}


def test_cli_default_path_under_repo(tmp_path: Path) -> None:
    append_lessons(tmp_path / ".kfbot" / "experience.md", [win()])
    result = _cli("--repo", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert [x["kernel"] for x in json.loads(result.stdout)] == [SOFTMAX]


def test_cli_missing_and_malformed_files(tmp_path: Path) -> None:
    missing = tmp_path / "none.md"
    result = _cli("--file", str(missing))
    assert (result.returncode, result.stdout.strip()) == (0, f"no lessons yet in {missing}")
    result = _cli("--file", str(missing), "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    bad = tmp_path / "bad.md"
    bad.write_text("notes\n\n" + render_lesson(win()).replace("- origin: rules", "- origin: x"))
    result = _cli("--file", str(bad))
    assert result.returncode == 2
    assert f"kfbot: error: {bad}:7: bad origin: origin 'x' is not one of" in result.stderr
