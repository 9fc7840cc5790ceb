"""`kfbot action`: what the GitHub Action runs, reading the runner's environment.

    GITHUB_EVENT_NAME, GITHUB_EVENT_PATH, GITHUB_REPOSITORY, GITHUB_WORKSPACE,
    GITHUB_API_URL, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, RUNNER_TEMP and INPUT_*

The event decides what happens, unless the `command` input says: a `/kfbot` comment on
a pull request is answered, a pull request's changed kernels are guarded, a schedule
optimizes. Every run ends the same way, failures included: annotations, the job
summary (verdict first), the outputs and the full report in a file. Secrets are masked
for the runner first and removed from everything kfbot writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from github.Repository import Repository

from kfbot import git
from kfbot.cache import cache_dir
from kfbot.commands.options import add_repo_argument
from kfbot.config import Config, GithubConfig, load_config
from kfbot.errors import EXIT_FAILURE, EXIT_MISSING_TOOL, EXIT_OK, KfbotError
from kfbot.evaluate.engine import JOBS, KFBOT_PARENT, Engine, EngineSettings
from kfbot.evaluate.sandbox import credentials
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.evaluate.worker import WorkerSession
from kfbot.github import action_io
from kfbot.github.action_io import ActionInputs, Annotation, Level, Result, search_seconds
from kfbot.github.api import DEFAULT_RETRY, call, connect, repository
from kfbot.github.authorize import Head, policy_on_default_branch
from kfbot.github.comments import (
    Command,
    Settings,
    answer_handed,
    handle_comment,
    ignored_because,
)
from kfbot.github.events import CommentEvent, PullRequestEvent, load_event
from kfbot.github.handoff import Recorder
from kfbot.github.prbody import run_url
from kfbot.github.redaction import Redactor, redacted_streams
from kfbot.github.status import StatusComment, StatusSink
from kfbot.paths import kfbot_folder
from kfbot.scan.model import ScanReport
from kfbot.scan.render import to_markdown
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.progress import build_heartbeat, log_group
from kfbot.text import printable, utf8_safe

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from kfbot.github.publish import Winner
    from kfbot.search.llm import LlmMutator
    from kfbot.search.plan import OptimizeSettings
    from kfbot.search.runner import OptimizeOutcome

# The search (and the anthropic SDK under it, seconds to import) is imported only where
# a GPU search really runs: comment handling and the guard start without it.

# Seconds between GitHub API reads and between writes, "READ,WRITE": GitHub answers
# bursts of writes from integrations with secondary rate limits. Tests against a local
# server set "0,0".
INTERVALS_VARIABLE = "KFBOT_GITHUB_INTERVALS"
DEFAULT_INTERVALS = (0.25, 1.0)
# How often a comment command's status comment says the best so far, at most.
STATUS_EVERY_S = 180.0
GPU_HINT = ("run the workflow on a self-hosted runner with a CUDA GPU and the CUDA toolkit "
            "(`runs-on: [self-hosted, gpu]`)")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "action", help="run as the GitHub Action (reads GITHUB_* and INPUT_* variables)",
        description="The GitHub Action's entry point: reads the event, the INPUT_* "
                    "variables and the runner's GITHUB_* variables; see docs/github-action.md.")
    add_repo_argument(p, default=None,
                      help="the checkout to work on (default: $GITHUB_WORKSPACE, else .)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return Action(credentials.original_environment(), args.repo).run()


class Action:
    def __init__(self, env: Mapping[str, str], root: Path | None = None) -> None:
        self.env = env
        self.root = root
        names = [action_io.env_name(n) for n in action_io.SECRET_INPUTS]
        names += ["GITHUB_TOKEN", "GH_TOKEN", "ANTHROPIC_API_KEY"]
        self.redact = Redactor(env.get(name, "").strip() for name in names)
        self.report_path = _report_dir(env) / "kfbot-report.md"
        self.recorder: Recorder | None = None  # the two-job split: what goes to the artifact
        self.head: str | None = None  # the commit checked out when kfbot started

    def run(self) -> int:
        for line in self.redact.mask_commands():
            print(line, flush=True)
        with redacted_streams(self.redact):
            return self._run()

    def _run(self) -> int:
        try:
            result = self._result()
        except KfbotError as exc:
            result = Result(f"error: {exc}", exit_code=exc.exit_code,
                            annotations=(Annotation("error", str(exc), title="kfbot"),))
        except Exception as exc:  # a bug: still leave the summary and the report behind
            print(self.redact(traceback.format_exc()), file=sys.stderr)
            result = Result(f"internal error: {type(exc).__name__}: {exc}",
                            exit_code=EXIT_FAILURE)
        self._emit(result)
        return result.exit_code

    def _result(self) -> Result:
        inputs = action_io.read_inputs(self.env)
        token = inputs.token or self.env.get("GITHUB_TOKEN", "").strip()
        inputs = dataclasses.replace(inputs, token=token)
        inputs = dataclasses.replace(inputs, anthropic_api_key=inputs.anthropic_api_key or (
            self.env.get("ANTHROPIC_API_KEY", "").strip()))
        _keep_secrets_from_subprocesses()
        ctx = Context.from_env(self.env, inputs, self.redact, self.root)
        if inputs.command == "publish":
            from kfbot.commands.publish import publish_mode  # it uses this module's Context

            return publish_mode(ctx)
        if inputs.artifact:  # before anything of the checkout runs
            self.head = git.commit_of(ctx.root, "HEAD") if ctx.root.is_dir() else None
            self.recorder = Recorder(Path(inputs.artifact))
            ctx = dataclasses.replace(ctx, recorder=self.recorder)
        event = load_event(ctx.event_name, ctx.event_path, ctx.repository)
        mode = _mode(inputs.command, ctx.event_name)
        if mode == "authorize" and self.recorder is not None:
            raise KfbotError("action input 'artifact': an authorize job writes to GitHub "
                             "itself; give the artifact folder to the GPU job")
        log.info("event %s, command %s: %s", ctx.event_name, inputs.command, mode)
        if mode in ("comment", "authorize") and isinstance(event, CommentEvent):
            return comment_mode(ctx, event, authorize_only=mode == "authorize")
        if mode == "guard" and isinstance(event, PullRequestEvent):
            from kfbot.commands.guard import guard_mode  # it uses this module's helpers

            return guard_mode(ctx, event)
        if mode == "scan":
            return scan_result(ctx.config(), ctx.root)
        return optimize_all(ctx)

    def _emit(self, result: Result) -> None:
        for note in result.annotations:
            print(self.redact(note.command()), flush=True)
        markdown = utf8_safe(self.redact(
            f"## kfbot: {result.headline}\n\n{result.details}".rstrip() + "\n"))
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        self.report_path.write_text(markdown, encoding="utf-8")
        action_io.write_summary(_path(self.env, "GITHUB_STEP_SUMMARY"), markdown,
                                str(self.report_path))
        outputs = {k: self.redact(v) for k, v in result.outputs(str(self.report_path)).items()}
        action_io.write_outputs(_path(self.env, "GITHUB_OUTPUT"), outputs)
        if self.recorder is not None:
            self.recorder.finish(self.env.get("GITHUB_REPOSITORY", ""),
                                 self.env.get("GITHUB_EVENT_NAME", ""),
                                 self.env.get("GITHUB_RUN_ID", ""), self.head, result,
                                 self.redact)
        stream = sys.stdout if result.exit_code == EXIT_OK else sys.stderr
        print(printable(self.redact(f"kfbot: {result.headline}")), file=stream, flush=True)


def _keep_secrets_from_subprocesses() -> None:
    """Take every secret out of the environment that compilers, git and tests inherit.

    kfbot holds them in memory (`kfbot.evaluate.sandbox.credentials`, the action's inputs)
    and hands them to the one `git push` and the API clients that need them. `kfbot
    action` started as a program has already re-executed itself without them; this covers
    a caller that runs it in-process.
    """
    for name in (*(action_io.env_name(n) for n in action_io.SECRET_INPUTS), "GITHUB_TOKEN",
                 "GH_TOKEN", "ANTHROPIC_API_KEY"):
        os.environ.pop(name, None)


def _path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "").strip()
    return Path(value) if value else None


def _report_dir(env: Mapping[str, str]) -> Path:
    temp = env.get("RUNNER_TEMP", "").strip()
    return Path(temp) / "kfbot" if temp else Path(tempfile.gettempdir()) / "kfbot-action"


def _mode(command: str, event_name: str) -> str:
    if command == "auto":
        return {"issue_comment": "comment", "pull_request": "guard"}.get(event_name, "optimize")
    if event_name == "issue_comment":
        if command == "authorize":
            return "authorize"
        raise KfbotError(f"action input 'command': {command!r} does not apply to issue_comment "
                         "events (the comment holds the command); leave it at auto, or use "
                         "authorize in a job that checks nothing out")
    if command == "authorize":
        raise KfbotError(f"action input 'command': authorize needs an issue_comment event, "
                         f"not {event_name}")
    if command == "guard" and event_name != "pull_request":
        raise KfbotError(f"action input 'command': guard needs a pull_request event, "
                         f"not {event_name}")
    return command


# ---- the runner's environment ------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    env: Mapping[str, str]
    inputs: ActionInputs
    redact: Redactor
    event_name: str
    event_path: Path
    repository: str
    root: Path
    recorder: Recorder | None = None  # set: write nothing to GitHub, hand it over instead

    @classmethod
    def from_env(cls, env: Mapping[str, str], inputs: ActionInputs, redact: Redactor,
                 root: Path | None = None) -> Context:
        def need(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise KfbotError(f"{name} is not set: `kfbot action` runs inside a GitHub "
                                 "Actions job (or set the GITHUB_* variables as a job would)")
            return value

        root = (root or Path(env.get("GITHUB_WORKSPACE") or ".")).resolve()
        return cls(env, inputs, redact, need("GITHUB_EVENT_NAME"),
                   Path(need("GITHUB_EVENT_PATH")), need("GITHUB_REPOSITORY"), root)

    def config(self) -> Config:
        path = self.root / self.inputs.config if self.inputs.config else None
        return load_config(path, self.root)

    def github_config(self, base: GithubConfig) -> GithubConfig:
        if self.inputs.min_speedup is None:
            return base
        return dataclasses.replace(base, min_speedup=self.inputs.min_speedup)

    def token(self) -> str:
        token = self.inputs.token  # the input, else $GITHUB_TOKEN (see Action._result)
        if not token:
            raise KfbotError("no GitHub token: set the action's 'token' input (its default is "
                             "the job's GITHUB_TOKEN) or the GITHUB_TOKEN variable")
        return token

    def intervals(self) -> tuple[float, float]:
        text = self.env.get(INTERVALS_VARIABLE, "").strip()
        if not text:
            return DEFAULT_INTERVALS
        try:
            read, write = (float(part) for part in text.split(","))
        except ValueError:
            raise KfbotError(f"{INTERVALS_VARIABLE}: expected READ,WRITE seconds such as "
                             f"0.25,1, got {text!r}") from None
        return read, write

    def github(self) -> Repository:
        read, write = self.intervals()
        gh = connect(self.token(), env=self.env, read_interval=read, write_interval=write)
        return repository(gh, self.repository, DEFAULT_RETRY)

    def run_url(self) -> str | None:
        return run_url(self.env)

    def status(self, repo: Repository, number: int, key: str) -> StatusComment:
        issue = call(lambda: repo.get_issue(number), f"reading pull request #{number}",
                     DEFAULT_RETRY)
        return StatusComment(issue, key, self.redact, DEFAULT_RETRY)

    def status_sink(self, number: int, key: str) -> StatusSink:
        """The pull request's status comment, or, in a job that hands its run over, the
        handoff (the publish job posts it)."""
        if self.recorder is not None:
            return self.recorder
        return self.status(self.github(), number, key)


# ---- scan --------------------------------------------------------------------------------


def scan_result(config: Config, root: Path, only: set[str] | None = None) -> Result:
    """The kernel table of the checkout, problems (in `only` files, if given) annotated."""
    report = scan(root, config)
    count = len(report.kernels)
    headline = f"{count} CUDA kernel{'s' if count != 1 else ''} found" if count else \
        f"no CUDA kernels found ({report.files_scanned} source files scanned)"
    return Result(headline, to_markdown(report), EXIT_OK if count else EXIT_FAILURE,
                  annotations=problem_annotations(report, only))


def problem_annotations(report: ScanReport, only: set[str] | None = None
                        ) -> tuple[Annotation, ...]:
    levels: dict[str, Level] = {"error": "error", "warning": "warning", "info": "notice"}
    return tuple(Annotation(levels[p.severity], p.message, p.file, p.line, "kfbot scan")
                 for p in report.problems if only is None or p.file in only)


# ---- comment commands --------------------------------------------------------------------


def comment_mode(ctx: Context, event: CommentEvent, authorize_only: bool = False) -> Result:
    if ctx.recorder is not None:  # no token to write with: the publish job posts
        settings = Settings(ctx.root, GithubConfig, ctx.redact, ctx.run_url())
        result, report = answer_handed(event, ctx.inputs.head_sha or None, _Work(ctx),
                                       settings)
        if report is not None:
            ctx.recorder.show(report)
        return result
    why = ignored_because(event)
    if why is not None:  # before any request: edits and bots need no token
        return Result(f"nothing to do: {why}")
    repo = ctx.github()

    def policy() -> GithubConfig:
        return ctx.github_config(policy_on_default_branch(repo, ctx.inputs.config or None))

    settings = Settings(ctx.root, policy, ctx.redact, ctx.run_url(), DEFAULT_RETRY,
                        authorize_only=authorize_only,
                        approved_head=ctx.inputs.head_sha or None)
    return handle_comment(event, repo, _Work(ctx), settings)


class _Work:
    """The comment commands' work, on the checkout of the pull request's head."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def scan(self) -> Result:
        return scan_result(self.ctx.config(), self.ctx.root)

    def bench(self, command: Command) -> Result:
        from kfbot.evaluate.candidate import Candidate
        from kfbot.evaluate.report import to_markdown as evaluation_markdown
        from kfbot.evaluate.report import verdict_line

        task = task_for(self.ctx, command.kernel or "")
        require_gpu(self.ctx.root, self.ctx.inputs.gpu)
        with _engine(self.ctx, task) as engine:
            base = engine.baseline()
            itself = Candidate(params={"KFBOT_SELF_COMPARISON": "1"}, origin="user",
                               rationale="the original against itself")
            ev = engine.evaluate(itself, bench=True) if base.ok else base
        return Result(verdict_line(task.kernel_name, ev),
                      evaluation_markdown(task.kernel_name, ev),
                      EXIT_OK if ev.ok else EXIT_FAILURE, best_speedup=ev.speedup)

    def optimize(self, command: Command, policy: GithubConfig, head: Head,
                 before_publish: Callable[[], None], progress: Callable[[str], None]
                 ) -> Result:
        # The winner goes to the commented pull request's branch, where its author can
        # take it; a fork's branch is out of reach, so then to the pull request's base.
        github = dataclasses.replace(policy, base=head.base_ref if head.fork else head.ref)
        return optimize_kernel(self.ctx, command.kernel or "",
                               _search_settings(self.ctx.inputs, command), github,
                               before_publish, progress)


# ---- the GPU -----------------------------------------------------------------------------


def require_gpu(root: Path, gpu: int | None) -> None:
    """A KfbotError (EXIT_MISSING_TOOL) unless the GPU worker sees a CUDA GPU.

    Asked before anything is built: on a runner without a GPU, building first would
    spend minutes to learn the same thing.
    """
    with WorkerSession(gpu=gpu, cwd=root, python_path=[KFBOT_PARENT],
                       preload=("torch",)) as session:
        result = session.call(f"{JOBS}:probe", {"peaks": False}, timeout_s=300.0)
    if not result.ok or result.value is None:
        raise KfbotError(f"the GPU worker did not start: {result.reason}", EXIT_MISSING_TOOL)
    if not result.value.get("cuda"):
        raise KfbotError(f"no CUDA GPU: {result.value.get('reason')}", EXIT_MISSING_TOOL)


def task_for(ctx: Context, spec: str) -> KernelTask:
    """The task of the kernel `spec` names; an unknown name lists the close ones."""
    config = ctx.config()
    kernels = scan(ctx.root, config).kernels
    return make_task(select_kernel(kernels, spec), ctx.root, config, kernels)


def _engine(ctx: Context, task: KernelTask) -> Engine:
    return Engine(task, EngineSettings(cache_dir=cache_dir(), gpu=ctx.inputs.gpu,
                                       progress=build_heartbeat))


# ---- optimize ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchSettings:
    evaluations: int
    seconds: float | None
    islands: int


def _search_settings(inputs: ActionInputs, command: Command | None = None) -> SearchSettings:
    """The comment's options where it gives them, else the action's inputs. The time is
    the job's: the search keeps a margin below it (`search_seconds`)."""
    budget = command.budget if command and command.budget else inputs.budget
    seconds = command.time if command and command.time else inputs.time
    islands = command.islands if command and command.islands else inputs.islands
    return SearchSettings(budget, search_seconds(seconds), islands)


def optimize_all(ctx: Context) -> Result:
    """Schedule and workflow_dispatch: the kernel named, or each with a reference test."""
    config = ctx.config()
    kernels = scan(ctx.root, config).kernels
    specs = [ctx.inputs.kernel] if ctx.inputs.kernel else \
        [k.id for k in kernels if k.references]
    if not specs:
        raise KfbotError(f"{ctx.root}: no kernel with a reference test to optimize")
    github = ctx.github_config(config.github)
    settings = _search_settings(ctx.inputs)
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


def optimize_kernel(ctx: Context, spec: str, s: SearchSettings, github: GithubConfig,
                    before_publish: Callable[[], None] | None,
                    status: Callable[[str], None] | None = None) -> Result:
    """Search one kernel on the GPU and publish a verified winner; a plan on a dry run.
    `status` hears the best so far every few minutes (a comment command's status)."""
    task = task_for(ctx, spec)
    if ctx.inputs.dry_run:
        return _plan(task, s, bool(ctx.inputs.anthropic_api_key))
    require_gpu(ctx.root, ctx.inputs.gpu)
    return _search_and_publish(ctx, task, s, github, before_publish, status)


def _optimize_settings(s: SearchSettings) -> OptimizeSettings:
    from kfbot.search.plan import OptimizeSettings

    seed = int.from_bytes(os.urandom(4), "little") >> 1
    return OptimizeSettings(islands=s.islands, seed=seed, evaluations=s.evaluations,
                            seconds=s.seconds, started=time.monotonic())


def _plan(task: KernelTask, s: SearchSettings, llm_key: bool) -> Result:
    from kfbot.search.llm import NO_KEY_NOTICE
    from kfbot.search.plan import make_plan

    llm = "on" if llm_key else NO_KEY_NOTICE
    plan = "\n".join(make_plan(task, _optimize_settings(s), llm).lines())
    return Result(f"dry run: the plan for {task.kernel_name}", f"```\n{plan}\n```\n")


def _search(task: KernelTask, engine: Engine, settings: OptimizeSettings, run_dir: Path,
            llm: LlmMutator | None, status: Callable[[str], None] | None) -> OptimizeOutcome:
    """The search, a line per evaluation in the job's log and, for a comment command,
    the best so far on its status comment every few minutes."""
    from kfbot.search import progress
    from kfbot.search.executor import EngineExecutor
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


def _search_and_publish(ctx: Context, task: KernelTask, s: SearchSettings,
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
    from kfbot.search.llm import LlmMutator, LlmSettings
    from kfbot.search.plan import FINISH_S, reproduction_s

    with _engine(ctx, task) as engine:
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
