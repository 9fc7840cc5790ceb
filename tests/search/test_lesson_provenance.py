"""Lessons with provenance: where each was measured, only from a committed candidate with
no warning, lessons from elsewhere said to be so, and retired when their run is reverted
(by run id, or by reading a real git repository's reverts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kfbot.anticheat.findings import Finding
from kfbot.evaluate.evaluation import Check, Evaluation
from kfbot.search.experience import (
    Lesson,
    Where,
    append_lessons,
    candidate_tag,
    read_lessons,
    render_lesson,
)
from kfbot.search.provenance import lesson_doubt, lesson_line

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "csrc/softmax.cu::softmax_kernel"
H100 = Where("NVIDIA H100 80GB HBM3", "sm_90", "13.0", "2.11.0+cu130")
DIGEST = "3f2a9c81d0" + "e" * 54


def lesson(run: str = "softmax_kernel-7", date: str = "2026-11-20", change: str = "rules: "
           "warp per row", **where: str) -> Lesson:
    prov = {"arch": H100.arch, "cuda": H100.cuda, "torch": H100.torch, **where}
    return Lesson(KERNEL, H100.gpu, change, "rules", "faster", 3.1, None, "correct on 40 "
                  "checks", date, (candidate_tag(DIGEST),), run=run, **prov)


def test_provenance_is_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "experience.md"
    append_lessons(path, [lesson()])
    text = path.read_text()
    assert "- run: softmax_kernel-7\n- arch: sm_90\n- cuda: 13.0\n- torch: 2.11.0+cu130\n" in text
    assert read_lessons(path) == [lesson()]
    assert lesson().toolchain() == "sm_90, CUDA 13.0, torch 2.11.0+cu130"


def test_a_lesson_written_before_provenance_reads_back_with_none(tmp_path: Path) -> None:
    old = Lesson(KERNEL, "NVIDIA H200", "params: 256 threads", "params", "faster", 1.2, None,
                 "", "2025-06-01")
    path = tmp_path / "experience.md"
    path.write_text("# kfbot experience\n\n" + render_lesson(old) + "\nA note of mine.\n")
    (read,) = read_lessons(path)
    assert read == old and (read.run, read.arch, read.retired) == ("", "", "")
    append_lessons(path, [lesson()])
    assert "A note of mine." in path.read_text()  # the note stays with its lesson
    (again,) = [x for x in read_lessons(path) if x.gpu == "NVIDIA H200"]
    assert again.foreign_to(H100) == "no record of where it was measured"


def test_lessons_from_elsewhere_are_shown_as_such() -> None:
    assert lesson().foreign_to(H100) is None
    assert lesson(torch="2.11.2").foreign_to(H100) is None  # a patch release: the same
    said = lesson(arch="sm_80").foreign_to(H100)
    assert said is not None and "(sm_80, CUDA 13.0" in said and "not on this" in said
    other = Where("NVIDIA A100-SXM4-80GB", "sm_80", "12.1", "2.3.0")
    line = lesson_line(lesson(), other)
    assert line.endswith("[not measured on this machine: measured on NVIDIA H100 80GB HBM3 "
                         "(sm_90, CUDA 13.0, torch 2.11.0+cu130), not on this NVIDIA "
                         "A100-SXM4-80GB (sm_80, CUDA 12.1, torch 2.3.0)]")
    assert "[not measured" not in lesson_line(lesson(), H100)
    assert Where.of({"gpu": "NVIDIA H100", "capability": "9.0", "cuda": "13.0",
                     "torch": "2.11.0"}) == Where("NVIDIA H100", "sm_90", "13.0", "2.11.0")


def _evaluation(findings: tuple[Finding, ...] = (), passed: bool = True) -> Evaluation:
    checks = (Check("(4096, 1024) float32 seed#0", "reference", passed),)
    return Evaluation(DIGEST, "done", True, "correct", checks=checks, findings=findings)


def test_only_a_candidate_with_no_warning_teaches_a_lesson() -> None:
    assert lesson_doubt(_evaluation()) is None
    about_original = Finding("original-contract", "runtime", "warn", "the original is wrong "
                             "at wide (64, 513) float32", "left out of the contract")
    note = Finding("precision", "runtime", "note", "keeps 23.1 bits", "")
    assert lesson_doubt(_evaluation((about_original, note))) is None
    flag = Finding("physics-floor", "physics", "warn", "12.0x faster than the original", "")
    said = lesson_doubt(_evaluation((flag,)))
    assert said is not None and "[physics-floor] 12.0x faster" in said
    failed = lesson_doubt(_evaluation(passed=False))
    assert failed is not None and "did not pass" in failed


def _kfbot(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "kfbot", "lessons", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60)


def test_retire_by_run_id(tmp_path: Path) -> None:
    path = tmp_path / ".kfbot" / "experience.md"
    keep = lesson(run="softmax_kernel-8", change="params: 512 threads")
    append_lessons(path, [lesson(), keep])
    done = _kfbot("retire", "softmax_kernel-7", "--repo", str(tmp_path), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "retired: csrc/softmax.cu::softmax_kernel" in done.stdout
    retired, standing = sorted(read_lessons(path), key=lambda x: x.run)
    assert retired.retired.endswith(": run softmax_kernel-7 was reverted") and not \
        standing.retired
    assert "(retired)" in path.read_text() and "- retired: " in path.read_text()
    table = _kfbot("--repo", str(tmp_path), cwd=ROOT)
    assert "RETIRED" in table.stdout and "run softmax_kernel-8; sm_90" in table.stdout
    again = _kfbot("retire", "softmax_kernel-7", "--repo", str(tmp_path), cwd=ROOT)
    assert "no standing lessons of run softmax_kernel-7" in again.stdout
    # Appending the same lesson again does not bring a retired one back.
    append_lessons(path, [lesson(date="2026-12-01")])
    assert sorted(read_lessons(path), key=lambda x: x.run)[0].retired


def test_retire_needs_a_run_or_reverted(tmp_path: Path) -> None:
    append_lessons(tmp_path / ".kfbot" / "experience.md", [lesson()])
    for args in (("retire",), ("retire", "x", "--reverted"), ("softmax_kernel-7",)):
        result = _kfbot(*args, "--repo", str(tmp_path), cwd=ROOT)
        assert result.returncode == 2 and "error:" in result.stderr, args


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_retire_the_lessons_of_reverted_kfbot_commits(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "csrc").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "csrc" / "softmax.cu").write_text("// naive\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "naive softmax")
    # kfbot's commit: the kernel and its lesson, naming the candidate
    (repo / "csrc" / "softmax.cu").write_text("// warp per row\n")
    other = lesson(run="softmax_kernel-9", change="params: 64 threads")
    other = Lesson(**{**other.__dict__, "tags": (candidate_tag("a" * 64),)})
    append_lessons(repo / ".kfbot" / "experience.md", [lesson(), other])
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", f"kfbot: softmax_kernel 3.10x faster\n\nwarp per row\n\n"
         f"Kfbot-Kernel: {KERNEL}\nKfbot-Candidate: {DIGEST}\n")
    kfbot_commit = _git(repo, "rev-parse", "HEAD")
    # the change is reverted, but the experience file is kept as it is
    (repo / "csrc" / "softmax.cu").write_text("// naive\n")
    _git(repo, "commit", "-qam", f"Revert the softmax change\n\nThis reverts commit "
         f"{kfbot_commit}.\n")
    done = _kfbot("retire", "--reverted", "--repo", str(repo), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    by_run = {x.run: x for x in read_lessons(repo / ".kfbot" / "experience.md")}
    revert = _git(repo, "rev-parse", "HEAD")
    assert by_run["softmax_kernel-7"].retired.endswith(f"reverted by {revert[:10]}")
    assert not by_run["softmax_kernel-9"].retired
    again = _kfbot("retire", "--reverted", "--repo", str(repo), cwd=ROOT)
    assert "no standing lessons of 1 reverted kfbot commit" in again.stdout
