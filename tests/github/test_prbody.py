"""The pull request body: verdict first, the evidence in order, the marker kept, and
always within GitHub's size limit. Markers round-trip any kernel id."""

from __future__ import annotations

import random

from kfbot import __version__
from kfbot.anticheat.adequacy import Adequacy, MutantVerdict
from kfbot.anticheat.findings import Finding
from kfbot.evaluate.evaluation import Check, Evaluation, ShapeTiming
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.github.markers import (
    find_marker,
    find_pr_marker,
    find_status_marker,
    make_marker,
    pr_marker,
    status_marker,
)
from kfbot.github.prbody import MAX_BODY, Previous, PrReport, render, run_url, title, verdict
from kfbot.search.evolution.archive import Individual
from kfbot.search.experience import Lesson
from kfbot.search.model import Cell

KERNEL = "csrc/softmax.cu::softmax_kernel"
SHAPES = ("(4096, 1024) float32", "(128, 50257) float32")
CELL = Cell("global", "none", "thread-per-element", "128")
ENV = {"torch": "2.5.1", "gpu": "NVIDIA H100", "cuda": "12.4", "driver": "550.54.15",
       "sm_count": 132}


def _timing(shape: str, speedup: float, seed: int) -> ShapeTiming:
    rng = random.Random(seed)
    base = [100.0 + rng.random() for _ in range(30)]
    return ShapeTiming(shape, compare_times(base, [b / speedup for b in base],
                                            random.Random(seed)))


def _evaluation(speedups: tuple[float, ...] = (1.9, 1.78), checks: int = 2,
                findings: tuple[Finding, ...] = ()) -> Evaluation:
    timings = tuple(_timing(s, x, i) for i, (s, x) in enumerate(zip(SHAPES, speedups,
                                                                     strict=False)))
    made = [Check(SHAPES[i % 2], "reference" if i % 3 else "original", True,
                  max_abs_error=(i + 1) * 1e-7, check="correctness" if i % 4 else "output-poison")
            for i in range(checks)]
    return Evaluation("c" * 64, "done", True, "correct and faster", checks=tuple(made),
                      timings=timings, environment=ENV, findings=findings)


def _history(n: int, reason: str = "x") -> tuple[Individual, ...]:
    return tuple(Individual(f"h{i}", None, i % 2, CELL, 1 + i / n if i % 3 else None,
                            "done" if i % 3 else "build", reason, "llm", i)
                 for i in range(1, n + 1))


def _report(**kw: object) -> PrReport:
    fields: dict[str, object] = {
        "kernel_id": KERNEL, "kernel_name": "softmax_kernel", "evaluation": _evaluation(),
        "files": ("csrc/softmax.cu",), "rationale": "one warp per row, shuffle reductions",
        "branch": "kfbot/csrc-softmax.cu-softmax_kernel", "base": "main"}
    fields.update(kw)
    return PrReport(**fields)  # type: ignore[arg-type]


def test_the_verdict_is_one_line_with_the_interval_or_the_spread() -> None:
    one = _evaluation((1.84,), checks=1)
    assert verdict("softmax_kernel", one).startswith("softmax_kernel: 1.84x faster (95% CI 1.8")
    assert verdict("softmax_kernel", one).endswith(") on NVIDIA H100, verified on 1 input")
    two = _evaluation(checks=24)
    assert verdict("softmax_kernel", two) == (
        "softmax_kernel: 1.84x faster (geometric mean of 2 shapes, 1.78x–1.90x) on NVIDIA "
        "H100, verified on 2 inputs")
    assert title("softmax_kernel", two) == "kfbot: softmax_kernel 1.84x faster on NVIDIA H100"


def test_the_body_reads_top_down_with_the_marker_on_line_two() -> None:
    lessons = (Lesson(KERNEL, "NVIDIA H100", "warp shuffles", "llm", "faster", 1.84, None, "",
                      "2026-01-15"),)
    adequacy = Adequacy(("tests/test_softmax.py",), (MutantVerdict("zeros", "rejected"),
                                                     MutantVerdict("constant", "accepted")))
    warn = Finding("fast-math", "static", "warn", "uses --use_fast_math", "setup.py:12")
    report = _report(evaluation=_evaluation(checks=6, findings=(warn,)), adequacy=adequacy,
                     history=_history(9), islands=2, lessons=lessons,
                     run_url="https://github.com/octo/kernels/actions/runs/77")
    marker = pr_marker(KERNEL, sha="a" * 40)
    body = render(report, marker)
    lines = body.splitlines()
    assert lines[0].startswith("softmax_kernel: 1.84x faster") and lines[1] == marker
    order = ["## The change", "## Benchmark", "## Verification", "## Environment", "## Search",
             "## Lessons added", "## Reproduce", f"Opened by kfbot {__version__} in [this run]"
             "(https://github.com/octo/kernels/actions/runs/77)"]
    positions = [body.index(heading) for heading in order]
    assert positions == sorted(positions)
    assert "| `(4096, 1024) float32` | 100.61 ± 0.41 | 52.96 ± 0.22 | 1.900x | 1.895–1.905 |" \
        in body
    assert "| ✓ faster | – | 5.00e-07 |" in body  # no floor measured; the worst error
    assert "- 6 of 6 checks passed on 2 inputs" in body and "output-poison 2" in body
    assert "  - static/warn: [fast-math] uses --use_fast_math (setup.py:12)" in body
    assert "Test adequacy: the repository's test rejects 1 of 2 mutants: too weak " \
           "(it would let through: constant)." in body
    assert "| gpu | NVIDIA H100 |\n| driver | 550.54.15 |\n| cuda | 12.4 |\n| torch | 2.5.1 |" \
        in body
    assert "```mermaid\n%%{init: " in body and "\nxychart-beta\n" in body
    assert "<details><summary>Search history" in body
    assert "- warp shuffles (llm, NVIDIA H100): 1.840x faster" in body
    assert "kfbot verify softmax_kernel --candidate kfbot.patch --finalist" in body
    assert "What changed since the last run" not in body


def test_a_rerun_says_what_changed() -> None:
    body = render(_report(previous=Previous(1.52, "d" * 64, "b" * 40)), pr_marker(KERNEL))
    assert ("Speedup 1.52x → 1.84x; a new kernel change (candidate cccccccccc, was dddddddddd); "
            "last commit bbbbbbbbbb.") in body


def test_the_body_stays_under_githubs_limit_and_says_what_it_cut() -> None:
    long_reason = "nvcc: error: " + "too many resources requested for launch " * 3
    report = _report(history=_history(3000, long_reason), islands=2)
    body = render(report, pr_marker(KERNEL, sha="a" * 40))
    assert len(body) <= MAX_BODY
    assert "history shortened to the best" in body and "of 3000 evaluations" in body
    assert find_pr_marker(body, KERNEL) is not None

    huge = _report(evaluation=_evaluation(checks=4000), history=_history(3000, long_reason))
    body = render(huge, pr_marker(KERNEL))
    assert len(body) <= MAX_BODY and "checks: the body has a size limit" in body
    assert body.splitlines()[0].startswith("softmax_kernel: 1.84x faster")


def test_the_run_link_needs_all_three_variables() -> None:
    env = {"GITHUB_SERVER_URL": "https://github.com/", "GITHUB_REPOSITORY": "octo/kernels",
           "GITHUB_RUN_ID": "77"}
    assert run_url(env) == "https://github.com/octo/kernels/actions/runs/77"
    assert run_url({**env, "GITHUB_RUN_ID": ""}) is None
    body = render(_report(), pr_marker(KERNEL))
    assert f"Opened by kfbot {__version__}. " in body


def test_markers_round_trip_and_match_on_their_fields() -> None:
    odd = "csrc/a b.cu::ns::op<float>-->x--y%"
    marker = pr_marker(odd, sha="abc", speedup=1.84)
    assert "-->" not in marker[:-3] and "--" not in marker[4:-3]
    text = f"Some body\n{marker}\nmore {status_marker(12, 'optimize')}"
    assert find_pr_marker(text, odd) == {"kernel": odd, "sha": "abc", "speedup": "1.84"}
    assert find_pr_marker(text, "other") is None and find_pr_marker(text) is not None
    assert find_status_marker(text, pr=12, command="optimize") == {"pr": "12",
                                                                   "command": "optimize"}
    assert find_status_marker(text, pr=13) is None
    assert make_marker("status", pr=1, command="scan") == "<!-- kfbot:status pr=1 command=scan -->"
    assert find_marker("<!-- kfbot:pr kernel=k -->", "status") is None


def test_the_per_shape_picture_sits_after_the_benchmark() -> None:
    from kfbot.search.outcome.pershape import section

    ev = _evaluation()
    held = (_timing("(16384, 1024) float32", 0.7, 5),)
    holds = "\n".join(section(ev.timings, held, {"(16384, 1024) float32": 40.0},
                              ("the repository's variants timed: `ext.softmax_v2`",)))
    body = render(_report(evaluation=ev, per_shape=holds), pr_marker(KERNEL, sha="a" * 40))
    assert body.index("## Benchmark") < body.index("## Where it holds") \
        < body.index("## Verification")
    assert "| `(16384, 1024) float32` | held-out |" in body
    assert "- slower than the original at `(16384, 1024) float32` (held-out)" in body
    assert "- slower than the repository's own fastest variant at `(16384, 1024) float32`" \
        in body
    assert "## Where it holds" not in render(_report(), pr_marker(KERNEL, sha="a" * 40))


def test_findings_about_the_original_have_their_own_lines() -> None:
    from kfbot.evaluate.capture.signature import CallSignature, TensorSpec
    from kfbot.evaluate.inputs.contract import Trial, Verdict
    from kfbot.evaluate.render import to_markdown

    spec = TensorSpec((16, 12), "float32", (12, 1), True, "cuda")
    trial = Trial("edge", "edge (16, 12) float32", CallSignature("ext.op", (spec,)))
    about = Verdict(trial, "wrong", "reference's: 48 of 192 elements wrong (last_cols)").finding()
    assert about is not None
    cheat = Finding("size-literal", "runtime", "warn", "compares a size with 4096")
    ev = _evaluation(findings=(cheat, about))
    body = render(_report(evaluation=ev), make_marker("pr", kernel=KERNEL))
    assert "- Anti-cheating findings (static rules, runtime probes, timers, physics floor): " \
           "1 finding:" in body
    assert ("- Findings about the original (1 input kfbot added, left out of the contract: "
            "the candidate was not checked on them):\n  - the original is wrong at edge "
            "(16, 12) float32: reference's: 48 of 192 elements wrong (last_cols)") in body
    text = to_markdown("op", ev)
    assert "About the original (inputs left out of the contract):\n\n- the original is wrong" \
           in text
