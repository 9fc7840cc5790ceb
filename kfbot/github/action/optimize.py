"""The Action's optimize mode: each kernel searched on the GPU, and a verified,
reproduced winner published as a pull request, or handed to the publish job.

The search (and the anthropic SDK under it, seconds to import) is imported only where a
GPU search really runs: comment handling and the guard start without it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kfbot.cache import cache_dir
from kfbot.config import GithubConfig
from kfbot.errors import EXIT_FAILURE, KfbotError
from kfbot.evaluate.engine import Engine
from kfbot.evaluate.task import KernelTask
from kfbot.github.action.context import Context
from kfbot.github.action.gpu import engine_for, require_gpu, task_for
from kfbot.github.action_io import ActionInputs, Annotation, Result, search_seconds
from kfbot.github.comments import Command
from kfbot.github.handoff import Recorder
from kfbot.paths import kfbot_folder
from kfbot.scan.scanner import scan
from kfbot.search.progress import log_group

if TYPE_CHECKING:
    from kfbot.github.publish import Winner
    from kfbot.search.mutators.llm import LlmMutator
    from kfbot.search.plan import OptimizeSettings
    from kfbot.search.runner import OptimizeOutcome

# How often a comment command's status comment says the best so far, at most.
STATUS_EVERY_S = 180.0


@dataclass(frozen=True)
class AskedSearch:
    """What a comment or the Action's inputs ask of the search: its budget, its time, its
    islands (the island search's own knobs are `search.evolution.islands.SearchSettings`)."""

    evaluations: int
    seconds: float | None
    islands: int


def asked_search(inputs: ActionInputs, command: Command | None = None) -> AskedSearch:
    """The comment's options where it gives them, else the action's inputs. The time is
    the job's: the search keeps a margin below it (`search_seconds`)."""
    budget = command.budget if command and command.budget else inputs.budget
    seconds = command.time if command and command.time else inputs.time
    islands = command.islands if command and command.islands else inputs.islands
    return AskedSearch(budget, search_seconds(seconds), islands)


def optimize_all(ctx: Context) -> Result:
    """Schedule and workflow_dispatch: the kernel named, or each with a reference test."""
    config = ctx.config()
    kernels = scan(ctx.root, config).kernels
    specs = [ctx.inputs.kernel] if ctx.inputs.kernel else \
        [k.id for k in kernels if k.references]
    if not specs:
        raise KfbotError(f"{ctx.root}: no kernel with a reference test to optimize")
    github = ctx.github_config(config.github)
    settings = asked_search(ctx.inputs)
    started = time.monotonic()
    results = []
    for index, spec in enumerate(specs):
        # The kernels share the time: each gets an equal part of what is left.
        left = (settings.seconds or 0.0) - (time.monotonic() - started)
        share = dataclasses.replace(settings, seconds=max(left, 0.0) / (len(specs) - index))
        with log_group(f"kfbot optimize {spec}", sys.stdout):
            results.append(optimize_kernel(ctx, spec, share, github, None))
    return _combined(results)


def _combined(results: list[Result]) -> Result:
    if len(results) == 1:
        return results[0]
    best = max(results, key=lambda r: r.best_speedup or 0.0)
    published = [r for r in results if r.pr_url]
    headline = f"{len(published)} of {len(results)} kernels published" if published else \
        f"none of {len(results)} kernels published"
    details = "\n\n".join(f"### {r.headline}\n\n{r.details}" for r in results)
    return dataclasses.replace(best, headline=headline, details=details,
                               exit_code=max(r.exit_code for r in results),
                               annotations=tuple(a for r in results for a in r.annotations))


def optimize_kernel(ctx: Context, spec: str, s: AskedSearch, github: GithubConfig,
                    before_publish: Callable[[], None] | None,
                    status: Callable[[str], None] | None = None) -> Result:
    """Search one kernel on the GPU and publish a verified winner; a plan on a dry run.
    `status` hears the best so far every few minutes (a comment command's status)."""
    task = task_for(ctx, spec)
    if ctx.inputs.dry_run:
        return _plan(task, s, bool(ctx.inputs.anthropic_api_key))
    require_gpu(ctx.root, ctx.inputs.gpu)
    return _search_and_publish(ctx, task, s, github, before_publish, status)


def _optimize_settings(s: AskedSearch) -> OptimizeSettings:
    from kfbot.search.plan import OptimizeSettings

    seed = int.from_bytes(os.urandom(4), "little") >> 1
    return OptimizeSettings(islands=s.islands, seed=seed, evaluations=s.evaluations,
                            seconds=s.seconds, started=time.monotonic())


def _plan(task: KernelTask, s: AskedSearch, llm_key: bool) -> Result:
    from kfbot.search.mutators.llm import NO_KEY_NOTICE
    from kfbot.search.plan import make_plan

    llm = "on" if llm_key else NO_KEY_NOTICE
    plan = "\n".join(make_plan(task, _optimize_settings(s), llm).lines())
    return Result(f"dry run: the plan for {task.kernel_name}", f"```\n{plan}\n```\n")


def _search(task: KernelTask, engine: Engine, settings: OptimizeSettings, run_dir: Path,
            llm: LlmMutator | None, status: Callable[[str], None] | None) -> OptimizeOutcome:
    """The search, a line per evaluation in the job's log and, for a comment command,
    the best so far on its status comment every few minutes."""
    from kfbot.search import progress
    from kfbot.search.executors.local import EngineExecutor
    from kfbot.search.runner import optimize

    watchers: list[progress.Progress] = [progress.LogLines(sys.stdout, settings.evaluations)]
    if status is not None:
        watchers.append(progress.Every(status, STATUS_EVERY_S, settings.evaluations))
    shown = progress.Tee(*watchers)
    executor = progress.Watched(EngineExecutor(engine), shown)
    try:
        return optimize(task, engine, settings, run_dir, llm, executor.on_result, executor)
    finally:
        shown.close()


def _search_and_publish(ctx: Context, task: KernelTask, s: AskedSearch,
                        github: GithubConfig, before_publish: Callable[[], None] | None,
                        status: Callable[[str], None] | None) -> Result:
    from kfbot.search.stopping import RunStopped, call_all, stop_on

    settings = _optimize_settings(s)
    run_dir = kfbot_folder(task.root, "runs", f"{task.kernel_name}-{settings.seed}")
    stoppers: list[Callable[[], None]] = []
    try:  # the runner's SIGINT/SIGTERM at a timeout or a cancel: the report is kept
        with stop_on(settings.seconds, settings.started, lambda: call_all(stoppers)):
            outcome, settings = _searched(ctx, task, settings, run_dir, status, stoppers)
            return _published(ctx, task, outcome, settings, run_dir, github, before_publish)
    except RunStopped as stop:
        return Result(f"{task.kernel_name}: stopped ({stop.reason})", "", stop.exit_code)


def _searched(ctx: Context, task: KernelTask, settings: OptimizeSettings, run_dir: Path,
              status: Callable[[str], None] | None, stoppers: list[Callable[[], None]]
              ) -> tuple[OptimizeOutcome, OptimizeSettings]:
    """The search, and the settings it ran with (the time it kept for reproducing)."""
    from kfbot.search.budget import Budget, Limits
    from kfbot.search.mutators.llm import LlmMutator, LlmSettings
    from kfbot.search.plan import FINISH_S, reproduction_s

    with engine_for(ctx, task) as engine:
        stoppers.append(engine.builder.stop)
        base = engine.baseline()
        if not base.ok:
            raise KfbotError(f"{task.kernel_id}: the original fails its own reference: "
                             f"{base.reason}")
        llm = LlmMutator.from_env(LlmSettings(), Budget(Limits()), ctx.inputs.anthropic_api_key)
        kept = FINISH_S + reproduction_s(engine.builder.slowest_compile_s())
        settings = dataclasses.replace(settings, reserve_s=kept)
        return _search(task, engine, settings, run_dir, llm, status), settings


def _published(ctx: Context, task: KernelTask, outcome: OptimizeOutcome,
               settings: OptimizeSettings, run_dir: Path, github: GithubConfig,
               before_publish: Callable[[], None] | None) -> Result:
    from kfbot.github.publish import PublishSettings, publish, winner_of
    from kfbot.search.experience import DEFAULT_PATH, read_lessons
    from kfbot.search.plan import too_late
    from kfbot.search.runfolder import reproduce_run

    report = outcome.files["report"].read_text(encoding="utf-8")
    if outcome.interrupted:
        said = "nothing confirmed yet" if outcome.committed is None else \
            f"{outcome.committed[0].speedup or 0:.2f}x confirmed, not published"
        return Result(f"{task.kernel_name}: stopped ({outcome.interrupted}): {said}", report,
                      outcome.exit_code)
    if outcome.committed is None:  # the report's headline says so, and why
        return Result(f"{task.kernel_name}: nothing committed: no candidate that changes "
                      "files only was correct and significantly faster", report)
    best = outcome.committed[0]  # the fastest candidate that changes files only
    today = datetime.date.today().isoformat()
    lessons = tuple(lesson for lesson in read_lessons(kfbot_folder(task.root, DEFAULT_PATH.name))
                    if lesson.kernel == task.kernel_id and lesson.date == today)
    found = f"{task.kernel_name}: {best.speedup or 0:.2f}x"
    late = too_late(settings)
    if late:
        return Result(f"{found}, not published: {late}", report, EXIT_FAILURE,
                      best_speedup=best.speedup)
    try:  # the patch alone, timed by a second timer: publishing needs it to agree
        reproduction = reproduce_run(run_dir, cache_dir(), ctx.inputs.gpu)
    except KfbotError as exc:
        return Result(f"{found}, not published: the reproduction failed: {exc}", report,
                      best_speedup=best.speedup)
    winner = winner_of(task, outcome, settings.islands, lessons, reproduction)
    if ctx.recorder is not None:
        return _hand_over(ctx.recorder, task, winner, run_dir, found, report)
    read, write = ctx.intervals()
    try:
        if before_publish is not None:
            before_publish()
        published = publish(winner, PublishSettings(
            github=github, repo_slug=ctx.repository, token=ctx.token(), env=ctx.env,
            read_interval=read, write_interval=write))
    except KfbotError as exc:  # the search's report is kept, with why it was not published
        return Result(f"{found}, not published: {exc}", report, exc.exit_code,
                      best_speedup=best.speedup)
    return Result(f"{found}; {published.message}", report, pr_url=published.url or "",
                  pr_number=published.number,
                  pr_operation=published.operation if published.url else "none",
                  best_speedup=best.speedup,
                  annotations=tuple(Annotation("warning", w, title="kfbot")
                                    for w in published.warnings))


def _hand_over(recorder: Recorder, task: KernelTask, winner: Winner, run_dir: Path,
               found: str, report: str) -> Result:
    """The winner into the handoff: the publish job re-checks it and opens the PR."""
    from kfbot.github.handoff import publication_of
    from kfbot.search.runfolder import read_record

    request = read_record(run_dir).request
    recorder.add(publication_of(winner, request.commit, request.prefix, task.editable_files,
                                request.patch), request.patch, run_dir)
    return Result(f"{found}, verified and reproduced; the publish job opens the pull request",
                  report, best_speedup=winner.evaluation.speedup)
