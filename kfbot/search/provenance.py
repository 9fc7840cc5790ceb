"""Which lessons a run may teach and how others' lessons are shown: provenance.

A lesson is only as good as the evaluation it came from and the machine it was
measured on. `lesson_doubt` keeps a committed candidate with a warning on it (or a
check that did not pass) from teaching one; `lesson_line` shows a lesson measured on
another GPU, architecture or toolchain as such.
"""

from __future__ import annotations

from kfbot.evaluate.evaluation import Evaluation
from kfbot.search.experience import Lesson, Where

# Findings about the original (inputs it fails, which leave the contract), not about the
# candidate: they do not keep a candidate's lesson out of the experience file.
ABOUT_THE_ORIGINAL = frozenset({"original-contract"})


def lesson_doubt(ev: Evaluation) -> str | None:
    """Why a committed candidate's evaluation may not teach a lesson: a check that did
    not pass, or a warning about it (a physics flag, a precision loss, a stricter
    comparison than the test's...); None when it passed every check with none."""
    if not ev.ok:
        return f"the committed candidate's evaluation did not pass ({ev.reason})"
    failed = [c for c in ev.checks if not c.passed]
    if failed:
        return f"the check {failed[0].check} on {failed[0].input} did not pass"
    doubts = [f for f in ev.findings
              if f.severity in ("warn", "strict") and f.check not in ABOUT_THE_ORIGINAL]
    if doubts:
        return "the committed candidate carries warnings: " + "; ".join(
            f.line() for f in doubts[:3])
    return None


def lesson_line(lesson: Lesson, here: Where) -> str:
    """A lesson as the LLM reads it, with where it was measured when not here."""
    foreign = lesson.foreign_to(here)
    note = f" [not measured on this machine: {foreign}]" if foreign else ""
    return (f"{lesson.kernel} on {lesson.gpu}: {lesson.change} ({lesson.origin}) -> "
            f"{lesson.summary()}{note}")
