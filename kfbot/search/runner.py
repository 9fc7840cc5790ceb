"""`kfbot optimize` for one kernel: the search, and what the search leaves behind.

    outcome = optimize(task, engine, settings, run_dir)  # the GPU search

What it will search, before it runs, is `plan`.

The search runs the islands through an executor (by default the engine alone: builds
in parallel, GPU work in one worker; or one worker per GPU); every evaluation is
logged under the run folder so `--resume` continues a killed run. At the end one
candidate is committed: the fastest that is correct, cheat-free, significantly faster
and changes files only. Its hash heads the Markdown and JSON reports, its numbers are
their headline and table, `best.patch` holds its files, its lesson goes to the
experience file and it becomes a new local branch (through a git worktree). A faster
candidate that needs build parameters gets a section of its own, with its numbers and
the build edit that would carry them. `report.json` also records what `kfbot
reproduce` needs (see `runfolder`).
"""

from __future__ import annotations

import datetime
import json
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kfbot.anticheat.adequacy import Adequacy
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.engine import Engine
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.render import to_json as evaluation_json
from kfbot.evaluate.render import to_markdown as evaluation_markdown
from kfbot.evaluate.sources import units
from kfbot.evaluate.task import KernelTask
from kfbot.paths import kfbot_folder
from kfbot.search.branch import branch_name, write_branch
from kfbot.search.budget import Budget, Limits, spent_words
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.features import cell_of
from kfbot.search.evolution.islands import (
    Evaluate,
    IslandSearch,
    Outcome,
    RunLog,
    SearchResult,
    SearchSettings,
)
from kfbot.search.executors.local import EngineExecutor, Executor
from kfbot.search.experience import (
    DEFAULT_PATH,
    Lesson,
    Where,
    append_lessons,
    candidate_tag,
    read_lessons,
    relevant,
)
from kfbot.search.model import Cell
from kfbot.search.mutators.flags import task_flags
from kfbot.search.mutators.llm import LlmMutator
from kfbot.search.mutators.rotation import Mutators
from kfbot.search.outcome.heldout import where_it_holds
from kfbot.search.outcome.pershape import section as per_shape_section
from kfbot.search.outcome.report import (
    Series,
    best_so_far,
    history_table,
    mermaid_chart,
    png_chart,
    unified_patch,
)
from kfbot.search.outcome.variants import variants_where_timed
from kfbot.search.outcome.winner import (
    Confirmed,
    NeedsParameters,
    committable,
    confirm,
    near_miss,
    needs_parameters,
)
from kfbot.search.plan import OptimizeSettings, task_knobs
from kfbot.search.provenance import lesson_doubt, lesson_line
from kfbot.search.rewrites import load_rewrites
from kfbot.search.runfolder import PATCH, REPORT, SCHEMA, UNCONFIRMED_PATCH, base_of
from kfbot.search.sections import dropped_markdown, learned_from, llm_markdown
from kfbot.search.stopping import TIME_LIMIT, RunStopped, shielded
from kfbot.search.target import target_code
from kfbot.text import read_source


@dataclass
class OptimizeOutcome:
    result: SearchResult
    best: Evaluation | None
    best_candidate: Candidate | None
    spent: dict[str, float]
    files: dict[str, Path] = field(default_factory=dict)
    adequacy: Adequacy | None = None  # whether the repository's test can be trusted alone
    # The fastest publishable candidate that changes files only: what a branch can hold,
    # and the one candidate every reported number belongs to.
    committed: tuple[Evaluation, Candidate] | None = None
    # A faster candidate whose speed needs build parameters: a suggestion, never committed.
    needs_parameters: NeedsParameters | None = None
    # The second evaluation the committed candidate's numbers come from (see `confirm`).
    confirmation: Confirmed | None = None
    # Nothing committed: why the fastest correct candidate could not be (see `near_miss`).
    near_miss: str | None = None
    # The changes that led from the original to the committed candidate, first to last
    # (the candidate's own rationale is the last): what its speedup is owed to.
    lineage: tuple[str, ...] = ()
    # Why the committed candidate taught no lesson (a warning on it), for the report.
    lesson_note: str | None = None
    # The committed candidate verified and timed at held-out shapes (see `heldout`).
    held_out: Evaluation | None = None
    held_out_note: str = ""  # why held-out shapes were not timed, when they were not
    # Rewrites whose output did not compile, each with its compiler message.
    dropped_rewrites: Mapping[str, str] = field(default_factory=dict)
    llm: dict[str, Any] | None = None  # what the LLM mutator spent, per improvement
    # The repository's fastest other version of the op, per shape, where one was timed.
    variants: Mapping[str, float] = field(default_factory=dict)
    variant_note: str = ""
    # Stopped before the end (a signal, the hard time limit): why, the exit code the
    # command gives, and, with nothing confirmed, the fastest candidate verified so far.
    interrupted: str | None = None
    exit_code: int = 0
    unconfirmed: tuple[Candidate, float] | None = None


def cell_for(task: KernelTask, files: dict[str, str]) -> Cell:
    return cell_of(target_code([u.text for u in units(task, files)], task.kernel_name),
                   task.block)


class GpuFacts(Protocol):
    """What the search reads from the GPU side before it starts: a probed `Engine` on
    this machine, or a Ray actor's `Preflight` when the driver has no GPU."""

    @property
    def device(self) -> dict[str, Any]:
        ...

    def adequacy(self) -> Adequacy | None:
        ...


def optimize(task: KernelTask, engine: GpuFacts, settings: OptimizeSettings, run_dir: Path,
             llm: LlmMutator | None = None,
             on_result: Callable[[Individual], None] | None = None,
             executor: Executor | None = None) -> OptimizeOutcome:
    """The search on the GPU. The engine's baseline must already have passed.

    Evaluations run through `executor` (default: the engine alone, one GPU); the
    caller closes an executor it passes in.
    """
    if executor is None:
        if not isinstance(engine, Engine):
            raise TypeError("optimize without an executor needs an Engine to evaluate on")
        executor = EngineExecutor(engine)
    log = RunLog(run_dir)
    budget = Budget(Limits(settings.evaluations, settings.seconds, settings.tokens,
                           settings.usd), spent={"evaluations": len(log.load())},
                    started=settings.started, reserve_s=settings.reserve_s)
    mut = Mutators(task, task_knobs(task).knobs, load_rewrites(), llm, flags=task_flags(task),
                   task_text=_task_text(task), batch=settings.batch,
                   lessons=_known_lessons(task, Where.of(engine.device)))
    original = Individual(ORIGINAL.hash, None, 0, cell_for(task, {}), 1.0, "done",
                          "the original", "original", 0)
    evaluations: dict[str, Evaluation] = {}
    learn = _learner(mut, evaluations, random.Random(f"{settings.seed}:meta"), on_result)

    def outcome_of(cand: Candidate, ev: Evaluation) -> Outcome:
        fitness = ev.speedup if ev.ok and ev.speedup is not None else None
        return Outcome(cell_for(task, dict(cand.files)), fitness, ev.stage, ev.reason)

    evaluate = through(executor, outcome_of, evaluations, budget)
    search = IslandSearch(original, mut.propose, evaluate, budget,
                          SearchSettings(settings.islands, settings.migrate_every,
                                         settings.batch, settings.seed), log, learn,
                          near_light(evaluations, settings.light_stop))
    confirmed: Confirmed | None = None
    try:
        # Before the search, not after it: the repository's tests run once per mutant of
        # the op (cached while they are unchanged), a cost the time the search plans with
        # must already have paid rather than one the end of the run cannot afford.
        adequacy = engine.adequacy()
        result = search.run()
        logged = {h: i.fitness for h, i in log.load().items() if i.fitness and i.fitness > 1.0}
        confirmed = confirm(evaluations, mut.candidates,
                            lambda c: executor.evaluate([c])[0][1], logged,
                            budget.time_for_again)
        committed, held, held_note, held_miss = where_it_holds(engine, confirmed.committed)
    except RunStopped as stop:  # write what is verified so far; the command says it stopped
        outcome = stopped_outcome(search.result(stop.reason), evaluations,
                                  mut.candidates, budget, stop, confirmed)
        outcome.dropped_rewrites, outcome.llm = learned_from(mut)
        with shielded():
            outcome.files = write_outputs(task, outcome, run_dir, settings)
        return outcome
    best = result.best if result.best and result.best.hash != ORIGINAL.hash else None
    best_eval = evaluations.get(best.hash) if best else None
    best_cand = mut.candidates.get(best.hash) if best else None
    outcome = OptimizeOutcome(result, best_eval, best_cand, budget.spent(),
                              adequacy=adequacy, committed=committed,
                              confirmation=confirmed,
                              near_miss=held_miss or (None if committed else near_miss(
                                  evaluations, mut.candidates)),
                              held_out=held, held_out_note=held_note,
                              needs_parameters=needs_parameters(task, evaluations,
                                                                mut.candidates, committed),
                              lineage=lineage(committed[1], mut.candidates) if committed
                              else ())
    outcome.dropped_rewrites, outcome.llm = learned_from(mut)
    signalled = _time_variants(outcome, engine, task, budget)
    with shielded():
        outcome.files = write_outputs(task, outcome, run_dir, settings)
    if signalled is not None:
        raise signalled  # the report of the confirmed candidate is written
    return outcome


def _time_variants(outcome: OptimizeOutcome, engine: GpuFacts, task: KernelTask,
                   budget: Budget) -> RunStopped | None:
    """The repository's variants timed beside the confirmed candidate, where time is left.
    A stop meanwhile leaves them untimed and the confirmed figure standing: the time
    limit ends the run as finished, a signal once its report is written (returned)."""
    if outcome.committed is None or not budget.time_for_again():
        return None
    held = outcome.held_out
    try:
        outcome.variants, outcome.variant_note = variants_where_timed(
            engine, task, [*outcome.committed[0].timings,
                           *(held.timings if held and held.ok else ())])
    except RunStopped as stop:
        outcome.variant_note = f"the repository's variants were not timed: {stop.reason} first"
        return None if TIME_LIMIT in stop.reason else stop
    return None


def near_light(evaluations: Mapping[str, Evaluation], threshold: float | None
               ) -> Callable[[], str | None]:
    """Why the search can stop: a publishable candidate, or the original as timed beside
    any candidate, at `threshold` % of the speed of light or more."""

    def reached() -> str | None:
        if threshold is None:
            return None
        for digest, ev in evaluations.items():
            if ev.original_light is not None and ev.original_light >= threshold:
                return (f"the original already runs at {ev.original_light:.0f}% of the speed "
                        f"of light (threshold {threshold:.0f}%)")
            if ev.publishable and ev.light is not None and ev.light >= threshold:
                return (f"candidate {digest[:10]} runs at {ev.light:.0f}% of the speed of "
                        f"light (threshold {threshold:.0f}%)")
        return None

    return reached


def stopped_outcome(result: SearchResult, evaluations: Mapping[str, Evaluation],
                    candidates: Mapping[str, Candidate], budget: Budget, stop: RunStopped,
                    confirmed: Confirmed | None = None) -> OptimizeOutcome:
    """A run stopped before its end. A winner confirmed already is committed, with its
    numbers; else nothing is, and the fastest candidate verified so far is named, with
    its figure from the search."""
    found = committable(evaluations, candidates)
    if confirmed is not None and confirmed.committed is not None:
        return OptimizeOutcome(result, found[0] if found else None,
                               found[1] if found else None, budget.spent(),
                               committed=confirmed.committed, confirmation=confirmed,
                               held_out_note="held-out shapes were not timed: the run was "
                                             "stopped first",
                               lineage=lineage(confirmed.committed[1], candidates),
                               interrupted=stop.reason, exit_code=stop.exit_code)
    logged = [(i.fitness, candidates[i.hash]) for i in result.history
              if i.fitness and i.fitness > 1.0 and i.hash in candidates
              and i.hash not in evaluations and not candidates[i.hash].params]
    best = max([*([(found[0].speedup or 0.0, found[1])] if found else []), *logged],
               key=lambda pair: pair[0], default=None)
    return OptimizeOutcome(result, found[0] if found else None, found[1] if found else None,
                           budget.spent(), unconfirmed=(best[1], best[0]) if best else None,
                           interrupted=stop.reason, exit_code=stop.exit_code)


def lineage(cand: Candidate, candidates: Mapping[str, Candidate]) -> tuple[str, ...]:
    """The rationales of the candidate's ancestors and its own, the original's first
    child first: a tuned register-tiled kernel owes its speed to the tiling too."""
    chain: list[str] = []
    seen: set[str] = set()
    current: Candidate | None = cand
    # A params point equal to the original's values is the original itself: stop there.
    while current is not None and current.hash not in seen and current.hash != ORIGINAL.hash:
        seen.add(current.hash)
        chain.append(current.rationale or f"{current.origin} change")
        current = candidates.get(current.parent or "")
    return tuple(reversed(chain))


def credited(lineage: Sequence[str]) -> str:
    """A lesson's change: the last step as written, then the steps before it by id."""
    if not lineage:
        return ""
    before = [_step_id(step) for step in lineage[:-1]]
    return lineage[-1] + (f" (after {', '.join(before)})" if before else "")


def _step_id(step: str) -> str:
    """A change named short: a rule's id ("restrict-pointers"), a params point whole."""
    return step if step.startswith("params:") else step.split(":", 1)[0]


def _learner(mut: Mutators, evaluations: Mapping[str, Evaluation], rng: random.Random,
             shown: Callable[[Individual], None] | None) -> Callable[[Individual], None]:
    """Tells the mutators what each recorded evaluation taught, then shows it."""
    fitness = {ORIGINAL.hash: 1.0}

    def learn(child: Individual) -> None:
        ev, cand = evaluations.get(child.hash), mut.candidates.get(child.hash)
        if ev is not None and cand is not None:  # replayed ones were learnt from before
            parent = fitness.get(child.parent or "", 1.0)
            improved = child.fitness is not None and child.fitness > parent
            mut.note_result(child.island, cand, ev, improved, rng)
        if child.fitness is not None:
            fitness[child.hash] = child.fitness
        if shown is not None:
            shown(child)

    return learn


def _known_lessons(task: KernelTask, here: Where) -> tuple[str, ...]:
    """Lessons from earlier runs worth showing the LLM, most relevant first: retired ones
    never, and one measured on another GPU, architecture or toolchain (or with no record
    of where) said to be so, never passed off as this machine's."""
    try:
        path = kfbot_folder(task.root, DEFAULT_PATH.name)
        if not path.is_file():
            return ()
        standing = [x for x in read_lessons(path) if not x.retired]
    except KfbotError:
        return ()  # a damaged experience file must not stop the search; lessons says why
    found = relevant(standing, task.kernel_id, here.gpu, limit=8)
    return tuple(lesson_line(lesson, here) for lesson in found)


def through(executor: Executor, outcome: Callable[[Candidate, Evaluation], Outcome],
            evaluations: dict[str, Evaluation], budget: Budget | None = None) -> Evaluate:
    """The search's `evaluate` over an executor; every evaluation is kept in `evaluations`
    and its build and GPU seconds tell the budget's pace."""

    def evaluate(cands: Sequence[Candidate]) -> Iterable[tuple[Candidate, Outcome]]:
        for cand, ev in executor.evaluate(cands):
            evaluations[cand.hash] = ev
            if budget is not None:
                budget.pace.evaluated(ev.build_seconds, ev.eval_seconds)
            yield cand, outcome(cand, ev)

    return evaluate


def write_outputs(task: KernelTask, outcome: OptimizeOutcome, run_dir: Path,
                  settings: OptimizeSettings) -> dict[str, Path]:
    """The run folder's report, patch and charts; lessons; the committed branch."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    series = best_so_far(outcome.result.history, settings.islands)
    if png_chart(series, run_dir / "progress.png", f"{task.kernel_name}: best speedup"):
        files["chart"] = run_dir / "progress.png"
        drawn = "The same chart is drawn in `progress.png` beside this report."
    else:
        drawn = (f"`progress.png` was not drawn: matplotlib is not installed for "
                 f"{sys.executable} (`pip install 'kfbot[gpu]'` brings it).")
        print(f"kfbot: {drawn.replace('`', '')}", file=sys.stderr)
    patch = _patch(task, outcome.committed[1]) if outcome.committed else None
    if patch is not None:
        (run_dir / PATCH).write_text(patch, encoding="utf-8")
        files["patch"] = run_dir / PATCH
    outcome.lesson_note = _lessons(task, outcome, run_dir.name)
    if outcome.unconfirmed is not None:  # a stopped run's best, kept under its own name
        (run_dir / UNCONFIRMED_PATCH).write_text(_patch(task, outcome.unconfirmed[0]),
                                                 encoding="utf-8")
        files["unconfirmed patch"] = run_dir / UNCONFIRMED_PATCH
    else:  # a resumed run that finished: what it stopped with before is history
        (run_dir / UNCONFIRMED_PATCH).unlink(missing_ok=True)
    (run_dir / "report.md").write_text(_markdown(task, outcome, series, patch, drawn),
                                       encoding="utf-8")
    (run_dir / REPORT).write_text(json.dumps(_record(task, outcome), indent=1),
                                  encoding="utf-8")
    files["report"] = run_dir / "report.md"
    if outcome.committed is not None:
        _branch(task, outcome.committed, run_dir, files)
    return files


def headline(task: KernelTask, committed: tuple[Evaluation, Candidate] | None,
             missed: str | None = None, lineage: Sequence[str] = ()) -> str:
    """The report's first line of results: the committed candidate and its numbers."""
    if committed is None:
        return ("**Nothing committed: no candidate that changes files only was correct and "
                "significantly faster than the original.**"
                + (f" Closest: {missed}." if missed else ""))
    ev, cand = committed
    review = " It needs a person's review (see the flags below)." if ev.needs_review else ""
    steps = [_step_id(step) for step in lineage]
    path = f"; from the original by {' then '.join(steps)}" if len(steps) > 1 else ""
    return (f"**Committed candidate `{cand.short}`** ({cand.origin}: "
            f"{cand.rationale or 'no rationale'}{path}): every number below is of this "
            f"candidate, and `{PATCH}` holds exactly its files.{review}")


def stopped_headline(outcome: OptimizeOutcome) -> str:
    """A stopped run's first line: nothing confirmed, and the best verified so far."""
    said = (f"**Stopped ({outcome.interrupted}) before a winner was confirmed: nothing "
            "confirmed yet, nothing committed.**")
    if outcome.unconfirmed is None:
        return said + " No candidate verified so far was faster than the original."
    cand, figure = outcome.unconfirmed
    return (f"{said} The fastest verified so far: candidate `{cand.short}` ({cand.origin}: "
            f"{cand.rationale or 'no rationale'}), {figure:.2f}x in the search, not yet "
            f"timed again; `{UNCONFIRMED_PATCH}` holds its files. `kfbot optimize --resume` "
            "continues the run and confirms it.")


def _markdown(task: KernelTask, outcome: OptimizeOutcome, series: Series,
              patch: str | None, drawn: str = "") -> str:
    first = stopped_headline(outcome) if outcome.interrupted and not outcome.committed \
        else headline(task, outcome.committed, outcome.near_miss, outcome.lineage)
    lines = [f"# kfbot optimize: {task.kernel_id}", "",
             f"The search stopped: {outcome.result.stopped or 'it finished'}; it took "
             f"{spent_words(outcome.spent)}.", "", first, ""]
    lines += _confirmation_lines(outcome.confirmation)
    lines += [outcome.lesson_note, ""] if outcome.lesson_note else []
    if outcome.committed is not None and patch is not None:
        lines += [evaluation_markdown(task.kernel_name, outcome.committed[0]), "## Patch", "",
                  "```diff", patch, "```", ""]
    lines += _per_shape_section(outcome)
    lines += _parameters_section(task, outcome.needs_parameters)
    lines += dropped_markdown(outcome.dropped_rewrites) + llm_markdown(outcome.llm)
    if outcome.adequacy is not None:
        lines += ["## Test adequacy", "", outcome.adequacy.summary() + ".", "",
                  outcome.adequacy.markdown(), ""]
    lines += ["## Progress", "", "Every candidate the search evaluated, those that need build "
              "parameters included.", "", mermaid_chart(series), drawn, "", "## Search history",
              "",
              history_table(outcome.result.history)]
    return "\n".join(lines)


def _per_shape_section(outcome: OptimizeOutcome) -> list[str]:
    """Where the committed candidate holds: captured and held-out shapes, beside the
    repository's own variants where they were timed."""
    captured = outcome.committed[0].timings if outcome.committed else ()
    held = outcome.held_out.timings if outcome.held_out and outcome.held_out.ok else ()
    return per_shape_section(captured, held, outcome.variants,
                             (outcome.held_out_note, outcome.variant_note))


def _confirmation_lines(found: Confirmed | None) -> list[str]:
    if found is None:
        return []
    lines = []
    if found.committed is not None and found.search_speedup is not None:
        lines += [f"The committed candidate was evaluated again after the search; the figures "
                  f"below are that second evaluation's, which took no part in choosing it "
                  f"(in the search: {found.search_speedup:.2f}x).", ""]
    if found.dropped:
        lines += ["Not committed, though faster in the search:", "",
                  *[f"- {line}" for line in found.dropped], ""]
    return lines


def _parameters_section(task: KernelTask, found: NeedsParameters | None) -> list[str]:
    if found is None:
        return []
    names = ", ".join(f"{k}={v}" for k, v in sorted(found.candidate.params.items()))
    return ["## Faster with build parameters (a suggestion, not committed)", "",
            f"Candidate `{found.candidate.short}` ({found.candidate.origin}: "
            f"{found.candidate.rationale or 'no rationale'}) was faster, but its speed needs "
            f"build parameters ({names}) that a patch of the repository's files cannot "
            "carry, so it is neither the headline nor on the branch. Its own numbers:", "",
            evaluation_markdown(task.kernel_name, found.evaluation),
            "To have it, change the repository's build:", "",
            *[f"- {edit}" for edit in found.edits], ""]


def _record(task: KernelTask, outcome: OptimizeOutcome) -> dict[str, Any]:
    """report.json: the committed candidate's numbers and what reproducing them needs."""
    committed = outcome.committed
    ev, cand = committed if committed else (None, None)
    reads = [*task.editable_files, *task.build.sources, task.build.file]
    found = outcome.needs_parameters
    return {
        "schema": SCHEMA, "kernel": task.kernel_id, "kernel_name": task.kernel_name,
        "stopped": outcome.result.stopped, "spent": outcome.spent,
        "base": base_of(task.root, [*reads, *(cand.files if cand else ())]).to_json(),
        "candidate": cand.hash if cand else None,
        "origin": cand.origin if cand else None,
        "rationale": cand.rationale if cand else None,
        "patch": PATCH if cand else None,
        "best": evaluation_json(task.kernel_name, ev) if ev else None,
        "confirmation": {
            "search_speedup": outcome.confirmation.search_speedup,
            "dropped": list(outcome.confirmation.dropped),
        } if outcome.confirmation else None,
        "near_miss": outcome.near_miss,
        "held_out": evaluation_json(task.kernel_name, outcome.held_out)
        if outcome.held_out else None,
        "held_out_note": outcome.held_out_note or None,
        "dropped_rewrites": dict(outcome.dropped_rewrites),
        "variants": dict(outcome.variants), "variant_note": outcome.variant_note or None,
        "llm": outcome.llm,
        "interrupted": outcome.interrupted,
        "unconfirmed": {"candidate": outcome.unconfirmed[0].hash,
                        "speedup_in_search": round(outcome.unconfirmed[1], 6),
                        "patch": UNCONFIRMED_PATCH} if outcome.unconfirmed else None,
        "needs_parameters": {
            "candidate": found.candidate.hash, "params": dict(found.candidate.params),
            "edits": list(found.edits),
            "evaluation": evaluation_json(task.kernel_name, found.evaluation),
        } if found else None,
        "history": [i.to_json() for i in outcome.result.history],
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _branch(task: KernelTask, committed: tuple[Evaluation, Candidate], run_dir: Path,
            files: dict[str, Path]) -> None:
    """The winner's local branch; a failure to write it keeps every other result and is
    said in the report and on stderr."""
    won, chosen = committed
    name = branch_name(task.kernel_id, chosen.short)
    try:
        write_branch(task.root, dict(chosen.files), name,
                     f"kfbot: {task.kernel_name} {won.speedup or 0:.2f}x faster\n\n"
                     f"{chosen.rationale}\n\nCandidate: {chosen.hash}")
    except KfbotError as exc:
        note = f"branch {name} was not written: {exc}"
        with (run_dir / "report.md").open("a", encoding="utf-8") as report:
            report.write(f"\n## Branch not written\n\n{note}\n")
        print(f"kfbot: {note}; the report and {PATCH} in {run_dir} hold the result",
              file=sys.stderr)
        return
    files["branch"] = Path(name)


def _patch(task: KernelTask, cand: Candidate) -> str:
    originals = {p: read_source(task.root / p, p) if (task.root / p).is_file() else None
                 for p in cand.files}
    return unified_patch(originals, dict(cand.files))


def _lessons(task: KernelTask, outcome: OptimizeOutcome, run_id: str) -> str | None:
    """Append what the run learned: the committed change, tagged with its hash and with
    where it was measured, when it passed every check with no warning; else why not."""
    if outcome.committed is None:
        return None
    ev, cand = outcome.committed
    if cand.origin not in ("params", "rules", "llm"):
        return None
    doubt = lesson_doubt(ev)
    if doubt is not None:
        return f"No lesson was recorded: {doubt}."
    here = Where.of(ev.environment)
    verdict = ev.verdict if ev.verdict in ("faster", "slower", "noise") else "noise"
    change = credited(outcome.lineage) or cand.rationale or "best candidate"
    lesson = Lesson(task.kernel_id, here.gpu or "unknown GPU", change, cand.origin, verdict,
                    ev.speedup or 1.0, None, ev.reason, datetime.date.today().isoformat(),
                    (candidate_tag(cand.hash),), run=run_id, arch=here.arch, cuda=here.cuda,
                    torch=here.torch)
    append_lessons(kfbot_folder(task.root, DEFAULT_PATH.name), [lesson])
    return None


def _task_text(task: KernelTask) -> str:
    refs = "; ".join(r.source for r in task.references if getattr(r, "source", None))
    return (f"Op {task.op.module}.{task.op.name} (kernel {task.kernel_name}); editable files: "
            f"{', '.join(task.editable_files)}; reference: {refs or 'the repository tests'}.")
