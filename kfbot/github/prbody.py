"""The pull request a verified winner is published as: its title and its body.

The body reads top down: the one-line verdict (after a review banner and the physics
floor's flags with their evidence, when it flagged the result), what changed since
kfbot's last run on this branch, the candidate and its files, the per-shape benchmark
table, where the speedup holds (held-out shapes, the repository's own variants), the
second timer's reproduction of it, the verification and anti-cheating
evidence, the environment, the search chart, the lessons added to the experience file
and a one-command reproduction; long evidence is folded in `<details>`. Every figure is
of one candidate, whose hash the body names. It stays under
GitHub's 65,536-character limit by shortening the history and check tables, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfbot import __version__
from kfbot.anticheat.adequacy import Adequacy
from kfbot.evaluate.evaluation import Check, Evaluation, ShapeTiming
from kfbot.evaluate.inputs.contract import FINDING as CONTRACT_FINDING
from kfbot.evaluate.render import MARKS
from kfbot.evaluate.reproduce.model import TOLERANCE, Reproduction
from kfbot.evaluate.verdict.light import light_text
from kfbot.search.archive import Individual
from kfbot.search.experience import Lesson
from kfbot.search.report import best_so_far, history_table, mermaid_chart

MAX_BODY = 65_536  # GitHub's limit on a pull request body, in characters
_ROOM = MAX_BODY - 1_000  # what the sections may use: the marker and notes need the rest
_ENV_FIRST = ("gpu", "driver", "cuda", "torch", "capability", "sm_count")


@dataclass(frozen=True)
class Previous:
    """What kfbot published on this branch last time, read back from the PR's marker."""

    speedup: float | None
    candidate: str  # content hash
    sha: str  # the commit kfbot pushed


@dataclass(frozen=True)
class PrReport:
    """Everything the body says, as plain values."""

    kernel_id: str
    kernel_name: str
    evaluation: Evaluation
    files: tuple[str, ...] = ()  # the kernel files changed, repository paths
    rationale: str = ""  # what the winning change does, in a line
    adequacy: Adequacy | None = None
    history: tuple[Individual, ...] = ()
    islands: int = 1
    lessons: tuple[Lesson, ...] = ()  # lessons this PR adds to the experience file
    base: str = "main"
    branch: str = ""
    previous: Previous | None = None
    run_url: str | None = None
    reproduction: Reproduction | None = None
    per_shape: str = ""  # "Where it holds": the speedup per shape, captured and held out


def verdict(name: str, ev: Evaluation) -> str:
    """`softmax_kernel: 1.84x faster (95% CI 1.79–1.90) on NVIDIA H100, verified on 24 inputs`."""
    if ev.speedup is None:
        return f"{name}: {ev.reason or ev.stage} (no benchmark)"
    word = {"faster": "faster", "slower": "slower"}.get(ev.verdict or "", "within noise")
    ratios = [t.speedup.ratio for t in ev.timings]
    if len(ratios) == 1:
        s = ev.timings[0].speedup
        spread = f"{s.confidence:.0%} CI {s.ci_low:.2f}–{s.ci_high:.2f}"
    else:
        spread = f"geometric mean of {len(ratios)} shapes, {min(ratios):.2f}x–{max(ratios):.2f}x"
    gpu = ev.environment.get("gpu", "an unnamed GPU")
    inputs = len({c.input for c in ev.checks})
    light = f", at {ev.light:.0f}% of the speed of light" if ev.light is not None else ""
    return f"{name}: {ev.speedup:.2f}x {word} ({spread}) on {gpu}{light}, verified on " + \
        _plural(inputs, "input")


def title(name: str, ev: Evaluation) -> str:
    gpu = ev.environment.get("gpu", "GPU")
    return f"kfbot: {name} {ev.speedup or 0:.2f}x faster on {gpu}"


def run_url(env: Mapping[str, str]) -> str | None:
    """The GitHub Actions run this is part of, from the runner's environment."""
    parts = [env.get(k, "").strip() for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY",
                                              "GITHUB_RUN_ID")]
    return f"{parts[0].rstrip('/')}/{parts[1]}/actions/runs/{parts[2]}" if all(parts) else None


def render(report: PrReport, marker: str) -> str:
    """The body, with `marker` (hidden) on its second line; at most MAX_BODY characters."""
    total_history, total_checks = len(report.history), len(report.evaluation.checks)
    limits = [(total_history, total_checks)]
    limits += [(h, total_checks) for h in (200, 50, 10, 0) if h < total_history]
    limits += [(0, c) for c in (200, 50, 0) if c < total_checks]
    body = ""
    for history_limit, checks_limit in limits:
        body = "\n".join(_sections(report, history_limit, checks_limit))
        if len(body) + len(marker) + 2 <= _ROOM:
            break
    else:
        note = "\n\n*(body cut here: it exceeded GitHub's size limit)*"
        body = body[:_ROOM - len(marker) - len(note) - 2] + note
    first, _, rest = body.partition("\n")
    return f"{first}\n{marker}\n{rest}"


def _sections(r: PrReport, history_limit: int, checks_limit: int) -> list[str]:
    ev = r.evaluation
    out = _review(ev)
    out += [verdict(r.kernel_name, ev), ""]
    out += _changed_since(r)
    out += _summary(r)
    out += ["## Benchmark", "", _timings_table(ev), ""]
    out += _where_it_holds(r)
    out += _reproduced(r.reproduction)
    out += _evidence(r, checks_limit)
    out += ["## Environment", "", _environment(ev.environment), ""]
    out += _search(r, history_limit)
    out += _lessons(r.lessons)
    out += _reproduce(r)
    out += ["---", _footer(r)]
    return out


def _where_it_holds(r: PrReport) -> list[str]:
    """The per-shape picture: captured and held-out shapes with their intervals, the
    repository's own variants beside them, a line for each shape the candidate loses."""
    return [r.per_shape.rstrip(), ""] if r.per_shape.strip() else []


def _review(ev: Evaluation) -> list[str]:
    """The physics floor's flags, before anything else: why a person must look."""
    flags = [f for f in ev.findings if f.layer == "physics" and f.severity == "warn"]
    if not flags:
        return []
    lines = ["**Needs review:** kfbot's physics floor flagged this result, so it opens as a "
             "draft; look at the evidence before merging.", ""]
    lines += [f"- {_cell(f.reason)} (`{_cell(f.evidence)}`)" for f in flags]
    return [*lines, ""]


def _reproduced(rep: Reproduction | None) -> list[str]:
    if rep is None:
        return []
    rows = ["| shape | reported | reproduced | original µs | candidate µs | timed calls |",
            "|---|---:|---:|---:|---:|---:|"]
    rows += [f"| `{_cell(s.shape)}` | {s.reported:.3f}x | {s.reproduced:.3f}x | "
             f"{s.original_us:.2f} | {s.candidate_us:.2f} | {s.samples} |" for s in rep.shapes]
    return ["## Reproduced", "",
            "The patch on a clean copy of the commit the run started from, built from its own "
            f"build files and timed again in a fresh process by a second timer "
            f"({_cell(rep.method)}): "
            f"{rep.summary()}.", "", "\n".join(rows), "",
            f"A reproduction more than {TOLERANCE:.0%} below the reported speedup stops "
            "kfbot from publishing.", ""]


def _changed_since(r: PrReport) -> list[str]:
    prev = r.previous
    if prev is None:
        return []
    now = r.evaluation.speedup or 0.0
    before = f"{prev.speedup:.2f}x" if prev.speedup is not None else "unknown"
    same = prev.candidate == r.evaluation.candidate
    kernel = "the same kernel change" if same else \
        f"a new kernel change (candidate {r.evaluation.candidate[:10]}, was {prev.candidate[:10]})"
    return ["## What changed since the last run", "",
            f"Speedup {before} → {now:.2f}x; {kernel}; last commit {prev.sha[:10]}.", ""]


def _summary(r: PrReport) -> list[str]:
    lines = ["## The change", ""]
    if r.rationale:
        lines += [r.rationale, ""]
    lines += [f"Candidate `{r.evaluation.candidate[:10]}`: every figure below is of this one "
              "candidate, the code this branch holds.", ""]
    if r.files:
        lines += ["Files: " + ", ".join(f"`{f}`" for f in r.files), ""]
    lines += [f"Speedup is original time / candidate time (median of interleaved trials, "
              f"L2 flushed); `{r.branch or 'this branch'}` → `{r.base}`.", ""]
    return lines


def _max_error(ev: Evaluation, t: ShapeTiming) -> str:
    errors = [c.max_abs_error for c in ev.checks if c.input == t.input and c.against ==
              "reference"]
    return f"{max(errors):.2e}" if errors else "–"


def _timings_table(ev: Evaluation) -> str:
    rows = ["| shape | original µs (median ± IQR) | candidate µs (median ± IQR) | speedup "
            "| 95% CI | significance | % of speed of light (original) | max abs error |",
            "|---|---:|---:|---:|---|---|---:|---:|"]
    for t in ev.timings:
        s = t.speedup
        light = f"{light_text(t.light)} ({light_text(t.original_light)})" \
            if t.floor is not None else "–"
        rows.append(f"| `{_cell(t.input)}` | {s.baseline.median:.2f} ± {s.baseline.iqr:.2f} | "
                    f"{s.candidate.median:.2f} ± {s.candidate.iqr:.2f} | {s.ratio:.3f}x | "
                    f"{s.ci_low:.3f}–{s.ci_high:.3f} | {MARKS[s.verdict]} | {light} | "
                    f"{_max_error(ev, t)} |")
    if not ev.timings:
        rows.append("| (no benchmark) | | | | | | | |")
    return "\n".join(rows + _floor_note(ev))


def _floor_note(ev: Evaluation) -> list[str]:
    """How the speed of light was set, once under the table."""
    floors = [t.floor for t in ev.timings if t.floor is not None]
    if not floors:
        return []
    flops = sorted({f.flops_from for f in floors if f.flops_from})
    what = "the bytes each call must move" + (
        f" and the FLOPs it must do ({', '.join(flops)})" if flops else "")
    return ["", f"Speed of light: the least time {what} take at this GPU's measured copy "
                "bandwidth and matmul rate (floor µs: "
                + ", ".join(f"{f.us:.2f} {f.bound}" for f in floors) + ")."]


def _evidence(r: PrReport, checks_limit: int) -> list[str]:
    ev = r.evaluation
    cheats = [f for f in ev.findings if f.check not in (CONTRACT_FINDING, "precision")]
    precision = [f for f in ev.findings if f.check == "precision"]
    against = {who: sum(c.against == who for c in ev.checks) for who in ("reference", "original")}
    probes: dict[str, int] = {}
    for c in ev.checks:
        if c.check != "correctness":
            probes[c.check] = probes.get(c.check, 0) + 1
    inputs = len({c.input for c in ev.checks})
    lines = ["## Verification", "",
             f"- {sum(c.passed for c in ev.checks)} of {_plural(len(ev.checks), 'check')} passed "
             f"on {_plural(inputs, 'input')} (fresh random values from secret seeds): "
             f"{against['reference']} against the PyTorch reference, {against['original']} "
             "against the original.",
             "- Runtime anti-cheating probes: " + (", ".join(
                 f"{k} {n}" for k, n in sorted(probes.items())) or "none recorded") + ".",
             "- Anti-cheating findings (static rules, runtime probes, timers, physics floor): "
             + ("none." if not cheats else f"{_plural(len(cheats), 'finding')}:")]
    lines += [f"  - {f.layer}/{f.severity}: {_cell(f.line())}" for f in cheats]
    # Bits of the op's dtype kept against a float64 reference, the original's beside:
    # a warning when the candidate lost several (a lower precision inside).
    lines += [f"- Precision{' (warning)' if f.severity == 'warn' else ''}: {_cell(f.reason)} "
              f"(on `{_cell(f.evidence)}`)." for f in precision]
    lines += _about_the_original(ev)
    if r.adequacy is not None:
        lines += [f"- Test adequacy: {r.adequacy.summary()}.", "",
                  _folded("Test adequacy: the repository's test against mutants of the op",
                          r.adequacy.markdown())]
    lines += ["", _folded("All checks", _checks_table(ev.checks, checks_limit)), ""]
    return lines


def _about_the_original(ev: Evaluation) -> list[str]:
    """Inputs kfbot added on which the original itself fails: left out of the contract,
    so the candidate was not held to them, and worth a look by the repository's owners."""
    found = [f for f in ev.findings if f.check == CONTRACT_FINDING]
    if not found:
        return []
    return [f"- Findings about the original ({_plural(len(found), 'input')} kfbot added, left "
            "out of the contract: the candidate was not checked on them):",
            *(f"  - {_cell(f.reason)}" for f in found)]


def _checks_table(checks: Sequence[Check], limit: int) -> str:
    rows = ["| input | check | against | result | max abs err | max rel err |",
            "|---|---|---|---|---:|---:|"]
    for c in checks[:limit]:
        result = "ok" if c.passed else (c.error or c.description or "mismatch")
        rows.append(f"| `{_cell(c.input)}` | {c.check} | {c.against} | {_cell(result)} | "
                    f"{c.max_abs_error:.2e} | {c.max_rel_error:.2e} |")
    if limit < len(checks):
        rows.append(f"\n*(showing {limit} of {len(checks)} checks: the body has a size limit)*")
    return "\n".join(rows)


def _environment(env: Mapping[str, Any]) -> str:
    keys = [k for k in _ENV_FIRST if k in env] + sorted(k for k in env if k not in _ENV_FIRST)
    if not keys:
        return "(not recorded)"
    rows = ["| | |", "|---|---|"] + [f"| {k} | {_cell(str(env[k]))} |" for k in keys]
    return "\n".join(rows)


def _search(r: PrReport, limit: int) -> list[str]:
    if not r.history:
        return []
    series = best_so_far(r.history, max(r.islands, 1 + max(i.island for i in r.history)))
    table = history_table(r.history, limit=limit) if limit else ""
    if limit < len(r.history):
        table += (f"\n*(history shortened to the best {limit} of {len(r.history)} evaluations: "
                  "the body has a size limit; the run folder has all of it)*\n")
    size = f"{_plural(len(r.history), 'evaluation')} on {_plural(r.islands, 'island')}."
    return ["## Search", "", size, "", mermaid_chart(series), _folded("Search history", table),
            ""]


def _lessons(lessons: Sequence[Lesson]) -> list[str]:
    if not lessons:
        return []
    lines = ["## Lessons added to `.kfbot/experience.md`", ""]
    lines += [f"- {_cell(lesson.change)} ({_cell(_measured(lesson))}): {lesson.summary()}"
              for lesson in lessons]
    return [*lines, ""]


def _measured(lesson: Lesson) -> str:
    """The mutator, and where the lesson was measured: GPU, toolchain and run."""
    parts = [lesson.origin, lesson.gpu, lesson.toolchain(),
             f"run {lesson.run}" if lesson.run else ""]
    return ", ".join(p for p in parts if p)


def _reproduce(r: PrReport) -> list[str]:
    name, branch = r.kernel_name, r.branch or "<this branch>"
    return ["## Reproduce", "", "On a machine with a CUDA GPU, from a checkout of "
            f"`{r.base}`:", "", "```bash",
            f"git fetch origin {branch} && git diff HEAD...FETCH_HEAD > kfbot.patch",
            f"kfbot verify {name} --candidate kfbot.patch --finalist && "
            f"kfbot bench {name} --candidate kfbot.patch", "```", ""]


def _footer(r: PrReport) -> str:
    run = f" in [this run]({r.run_url})" if r.run_url else ""
    return (f"<sub>Opened by kfbot {__version__}{run}. kfbot updates this pull request when "
            "it finds a faster kernel; a commit pushed here by a person stops it overwriting "
            "the branch.</sub>")


def _folded(summary: str, text: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{text}\n\n</details>"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _cell(text: str) -> str:
    """Safe inside a Markdown table cell or inline code: one line, no pipes or backticks."""
    return " ".join(text.split()).replace("|", "/").replace("`", "'")
