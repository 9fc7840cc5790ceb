"""Which candidate a run can commit: only file changes become a branch or a PR.

A candidate may also set build parameters (extra nvcc flags such as `--use_fast_math`)
that live in kfbot's build, not in the repository's files; committing only its files
would publish a different kernel than the one measured. So the candidate committed is
the fastest publishable one that changes files only, and the report says when the
overall best needed parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Evaluation


def committable(evaluations: Mapping[str, Evaluation], candidates: Mapping[str, Candidate]
                ) -> tuple[Evaluation, Candidate] | None:
    """The fastest publishable candidate without build parameters, or None."""
    best: tuple[Evaluation, Candidate] | None = None
    for digest, ev in sorted(evaluations.items()):  # sorted: ties break the same way
        cand = candidates.get(digest)
        if cand is None or cand.params or not cand.files or not ev.publishable:
            continue
        if best is None or (ev.speedup or 0.0) > (best[0].speedup or 0.0):
            best = (ev, cand)
    return best


def params_note(best: Candidate | None, chosen: Candidate | None) -> str | None:
    """A line for the report when the overall best could not be committed as it is."""
    if best is None or not best.params or (chosen is not None and chosen.hash == best.hash):
        return None
    names = ", ".join(f"{k}={v}" for k, v in sorted(best.params.items()))
    return (f"The fastest candidate also sets build parameters ({names}) that kfbot cannot "
            f"write into the repository's files; "
            + ("the branch holds the fastest file-only candidate instead."
               if chosen is not None else "no file-only candidate was faster, so no branch."))
