"""`kfbot optimize [kernel]`: search for a faster verified kernel within a budget."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from kfbot import extras
from kfbot.cache import cache_dir
from kfbot.commands.observing import add_observe_arguments, observed, wanted
from kfbot.commands.options import add_repo_arguments, duration_argument, percent_argument
from kfbot.config import load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK, KfbotError
from kfbot.evaluate import render
from kfbot.evaluate.baseline.steps import first_failure
from kfbot.evaluate.baseline.unready import unready_steps
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.sandbox import credentials
from kfbot.evaluate.task import KernelTask, TaskError, make_task
from kfbot.paths import kfbot_folder
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search import progress
from kfbot.search.budget import Budget, Limits, spent_words
from kfbot.search.executors.gpus import choose_gpus, visible_gpus
from kfbot.search.executors.local import EngineExecutor, Executor, LocalGpuExecutor, engines_per_gpu
from kfbot.search.mutators.llm import LlmMutator, LlmSettings, off_because
from kfbot.search.plan import FINISH_S, OptimizeSettings, make_plan, reproduction_s, too_late
from kfbot.search.progress import log_group
from kfbot.search.runfolder import UNCONFIRMED_PATCH, reproduce_run
from kfbot.search.runner import GpuFacts, OptimizeOutcome, optimize
from kfbot.search.stopping import RunStopped, call_all, stop_on

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("optimize", help="search for a faster, verified version of a kernel",
                       description="Search for a faster version of a kernel that passes its "
                                   "reference and the anti-cheating checks (GPU).")
    p.add_argument("kernel", nargs="?", help="kernel name, ns::name or file::name (default: "
                   "every kernel with a reference test, one after another)")
    add_repo_arguments(p)
    p.add_argument("--budget", type=int, default=64, metavar="N",
                   help="evaluations per kernel (`budget` in the Action and in comments)")
    p.add_argument("--time", type=duration_argument, default=None, metavar="DURATION",
                   help="wall-clock limit per kernel, with a unit: 90s, 30m, 1h30m "
                        "(default: none)")
    p.add_argument("--stop-at-light", type=percent_argument, default="90%", metavar="PERCENT",
                   help="stop once a publishable candidate, or the original, runs at this "
                        "share of the speed of light on the GPU or more, e.g. 80%% (0%%: "
                        "never; default 90%%)")
    p.add_argument("--islands", type=int, default=4, metavar="N",
                   help="populations that evolve apart and exchange their best")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="seed of the search's random choices (default: a random one, printed)")
    p.add_argument("--resume", metavar="RUN_ID",
                   help="continue a killed run from .kfbot/runs/RUN_ID (default: a new run)")
    p.add_argument("--no-llm", action="store_true",
                   help="params and rules mutators only (default: the LLM mutator too, when "
                        "ANTHROPIC_API_KEY is set)")
    p.add_argument("--gpu", type=int, default=None, metavar="N",
                   help="one GPU (the same as --gpus N; default: see --gpus)")
    p.add_argument("--gpus", metavar="LIST", help="GPU indices to use, e.g. 0,2 "
                   "(default: every visible GPU, one evaluation worker each)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where evaluations run: this machine's GPUs, or a Ray cluster")
    p.add_argument("--address", metavar="ADDR",
                   help="the Ray cluster to join (with --executor ray; default: start one)")
    p.add_argument("--build-cpus", type=int, default=0, metavar="N",
                   help="with --executor ray: build as Ray tasks of N CPUs and no GPU, which "
                        "may run on CPU-only nodes (default 0: each GPU actor builds)")
    add_observe_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="show what would be searched, without a GPU")
    pub = p.add_argument_group("publishing a verified winner (docs/publishing.md)")
    pub.add_argument("--publish", action="store_true",
                     help="push branch kfbot/<kernel> and open or update its pull request")
    pub.add_argument("--repo-slug", metavar="OWNER/NAME",
                     help="the GitHub repository (default: from the remote's URL)")
    pub.add_argument("--remote", default="origin", metavar="NAME", help="git remote to push to")
    pub.add_argument("--draft", action="store_true", default=None,
                     help="open the pull request as a draft (default: github.draft)")
    pub.add_argument("--publish-dry-run", type=Path, metavar="DIR",
                     help="write the pull request body and diff to DIR; push nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.budget < 1 or args.islands < 1:
        raise KfbotError("--budget and --islands must be at least 1")
    gpus = _gpus(args)  # bad --gpus or a missing Ray: said before any scan or build
    root = args.repo.resolve()
    config = load_config(args.config, root)
    scanned = scan(root, config)
    named = [select_kernel(scanned.kernels, args.kernel)] if args.kernel else scanned.kernels
    make = wanted(args.observe, named, root)
    scanned = observed(root, scanned, make, args.file_timeout,
                       confirm=[k.id for k in named] if args.kernel else None)
    kernels = scanned.kernels
    chosen = [select_kernel(kernels, args.kernel)] if args.kernel else \
        [k for k in kernels if k.references]
    if not chosen:
        raise KfbotError(f"{root}: no kernel with a reference test to optimize")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    settings = OptimizeSettings(islands=args.islands, seed=seed, evaluations=args.budget,
                                seconds=args.time, light_stop=100 * args.stop_at_light or None)
    console = Console()
    worst = EXIT_OK
    for kernel in chosen:
        try:
            task = make_task(kernel, root, config, kernels)
        except TaskError as exc:  # this kernel cannot run; the others still can
            console.print(f"{kernel.id}: not optimized: {exc}", highlight=False,
                          markup=False, soft_wrap=True)
            render.print_steps(unready_steps(kernel, scanned, exc), console)
            worst = max(worst, exc.exit_code)
            continue
        with log_group(f"kfbot optimize {task.kernel_id}", sys.stdout):
            worst = max(worst, _one(task, settings, args, console, gpus))
    return worst


def _one(task: KernelTask, settings: OptimizeSettings, args: argparse.Namespace,
         console: Console, gpus: list[int]) -> int:
    started = time.monotonic()  # `--time` bounds all of this kernel's run from here
    llm_state = "off (--no-llm)" if args.no_llm else \
        (off_because(_key()) or "on").removeprefix("llm mutator off: ")
    for line in make_plan(task, settings, llm_state).lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if args.dry_run:
        return EXIT_OK
    run_id = args.resume or f"{task.kernel_name}-{settings.seed}"
    run_dir = kfbot_folder(task.root, "runs", run_id)
    log.info("%s: run folder %s, executor %s, GPUs %s", task.kernel_id, run_dir,
             args.executor, gpus or "none visible")
    stoppers: list[Callable[[], None]] = []  # what a stop kills at once (the compilers)
    settings = replace(settings, started=started, reserve_s=FINISH_S)
    try:
        with stop_on(settings.seconds, started, functools.partial(call_all, stoppers)):
            outcome, settings = _search(task, settings, args, console, gpus, run_dir,
                                        stoppers)
            return _finish(task, outcome, run_dir, settings, args, console, gpus)
    except RunStopped as stop:  # before the search began, or after its report was written
        where = f" (in {stop.where})" if stop.where else ""
        console.print(f"stopped: {stop.reason}{where}; run folder {run_dir} (`kfbot optimize "
                      f"--resume {run_id}` continues the search)", highlight=False)
        return stop.exit_code


def _search(task: KernelTask, settings: OptimizeSettings, args: argparse.Namespace,
            console: Console, gpus: list[int], run_dir: Path,
            stoppers: list[Callable[[], None]]) -> tuple[OptimizeOutcome, OptimizeSettings]:
    """The search, and the settings it ran with (the time it kept for reproducing)."""
    llm = None if args.no_llm else LlmMutator.from_env(LlmSettings(), Budget(Limits()))
    engine_settings = EngineSettings(cache_dir=cache_dir(), gpu=gpus[0] if gpus else None,
                                     progress=progress.build_heartbeat)
    if args.executor == "ray":  # the GPUs are the cluster's: this machine may have none
        from kfbot.search.executors.ray import RayExecutor

        ray = RayExecutor(task, engine_settings, args.address, build_cpus=args.build_cpus)
        with contextlib.closing(ray):
            facts = ray.preflight()
            _require_baseline(task, facts.baseline, console)
            return search_with_progress(task, settings, run_dir, llm, console, facts,
                                        ray), settings
    extras.require("torch", "kfbot optimize")  # the GPU worker runs this interpreter
    with Engine(task, engine_settings) as engine:
        stoppers.append(engine.builder.stop)
        engine.probe()  # no GPU: say so now, after the plan
        _require_baseline(task, engine.baseline(), console)
        if args.publish or args.publish_dry_run:  # the reproduction fits in `--time` too
            settings = replace(settings, reserve_s=FINISH_S + reproduction_s(
                engine.builder.slowest_compile_s()))
        executor = _executor(task, engine, gpus)
        with contextlib.closing(executor):
            return search_with_progress(task, settings, run_dir, llm, console, engine,
                                        executor), settings


def _finish(task: KernelTask, outcome: OptimizeOutcome, run_dir: Path,
            settings: OptimizeSettings, args: argparse.Namespace, console: Console,
            gpus: list[int]) -> int:
    console.print(f"stopped: {outcome.result.stopped or 'finished'}; "
                  f"{spent_words(outcome.spent)}", highlight=False)
    if outcome.interrupted:
        if outcome.committed is not None:  # confirmed before the stop: its numbers stand
            _result(outcome, run_dir, console)
            return outcome.exit_code or EXIT_FAILURE
        return _interrupted(outcome, run_dir, console)
    code = _result(outcome, run_dir, console)
    if code == EXIT_OK and (args.publish or args.publish_dry_run):
        code = _publish(task, outcome, settings, args, gpus, console)
    return code


def _interrupted(outcome: OptimizeOutcome, run_dir: Path, console: Console) -> int:
    """What a stopped run verified, as its report says; the exit code is the stop's."""
    say = functools.partial(console.print, highlight=False, markup=False, soft_wrap=True)
    found = outcome.unconfirmed
    best = (f"the fastest verified so far is candidate {found[0].short}, {found[1]:.3f}x in "
            f"the search ({UNCONFIRMED_PATCH})" if found else "no candidate verified so far "
            "was faster")
    say(f"nothing confirmed yet: {best}; report {run_dir / 'report.md'}; `kfbot optimize "
        f"--resume {run_dir.name}` continues the run")
    return outcome.exit_code or EXIT_FAILURE


def _result(outcome: OptimizeOutcome, run_dir: Path, console: Console) -> int:
    """The committed candidate's numbers, the same as the report's headline."""
    say = functools.partial(console.print, highlight=False, markup=False, soft_wrap=True)
    found = outcome.needs_parameters
    if found is not None:
        say(f"faster with build parameters: candidate {found.candidate.short}, "
            f"{found.evaluation.speedup or 0:.3f}x; not committed (the report says how to "
            "carry the parameters into the build)")
    confirmed = outcome.confirmation
    for line in confirmed.dropped if confirmed else ():
        say(f"not committed: {line}")
    if outcome.committed is None:
        if outcome.near_miss:
            say(f"not committed: {outcome.near_miss}")
        say("no candidate that changes files only was correct and significantly faster; "
            f"nothing committed; run folder {run_dir}")
        return EXIT_FAILURE
    ev, cand = outcome.committed
    review = "; needs review (physics floor)" if ev.needs_review else ""
    again = "" if confirmed is None or confirmed.search_speedup is None else \
        f" (timed again after the search, which saw {confirmed.search_speedup:.3f}x)"
    say(f"best: {ev.speedup or 0:.3f}x ({ev.verdict}){again}, candidate {cand.short}{review}; "
        f"run folder {run_dir}")
    for what, path in outcome.files.items():
        say(f"  {what}: {path}")
    return EXIT_OK


def _publish(task: KernelTask, outcome: OptimizeOutcome, settings: OptimizeSettings,
             args: argparse.Namespace, gpus: list[int], console: Console) -> int:
    """Reproduce the committed candidate from its patch, then publish it (or say why not)."""
    from kfbot.github.publish import publish_after_run  # PyGithub only when publishing

    say = functools.partial(console.print, highlight=False, markup=False, soft_wrap=True)
    run_dir = outcome.files["report"].parent
    late = too_late(settings)
    if late:
        say(f"not published: {late}; `kfbot reproduce {run_dir}` checks the result")
        return EXIT_FAILURE
    try:
        reproduction = reproduce_run(run_dir, cache_dir(), gpus[0] if gpus else None)
        say(f"reproduction: {reproduction.summary()}")
    except KfbotError as exc:  # the run's results stand; only publishing is refused
        say(f"reproduction failed: {exc}")
        reproduction = None
    published = publish_after_run(task, outcome, settings.islands, args, reproduction)
    say(published.message)
    for warning in published.warnings:
        say(f"warning: {warning}")
    return EXIT_FAILURE if published.operation == "skipped" else EXIT_OK


def _require_baseline(task: KernelTask, base: Evaluation, console: Console) -> None:
    """The original must pass its baseline; where it does not, every step is shown (the
    first failure with its evidence and kfbot.yaml) before the search is refused."""
    failure = first_failure(base.steps)
    if failure is not None or not base.ok:
        render.print_steps(base.steps, console)
    if failure is not None and failure.step != "comparison":
        raise KfbotError(f"{task.kernel_id}: the baseline stopped at the {failure.step} step: "
                         f"{failure.summary} (`kfbot verify {task.kernel_name} --explain` "
                         "shows the evidence)")
    if not base.ok:
        raise KfbotError(f"{task.kernel_id}: the original fails its own reference: "
                         f"{base.reason}. If that error is one the op may make, declare the "
                         "tolerance in kfbot.yaml (tasks: tolerances), which candidates are "
                         "then held to")


def search_with_progress(task: KernelTask, settings: OptimizeSettings, run_dir: Path,
                         llm: LlmMutator | None, console: Console, gpu: GpuFacts,
                         executor: Executor) -> OptimizeOutcome:
    """The search, shown as it goes: the live table on a terminal, else a line per
    evaluation and a heartbeat (see kfbot.search.progress)."""
    shown = progress.for_stream(sys.stdout, settings.islands, settings.evaluations, console)
    watched = progress.Watched(executor, shown)
    try:
        return optimize(task, gpu, settings, run_dir, llm, watched.on_result, watched)
    finally:
        shown.close()


def _gpus(args: argparse.Namespace) -> list[int]:
    """The GPUs to run workers on: --gpu, --gpus, or every visible one."""
    if args.address is not None and args.executor != "ray":
        raise KfbotError("--address is for --executor ray")
    if args.build_cpus and args.executor != "ray":
        raise KfbotError("--build-cpus is for --executor ray (local builds use every core)")
    if args.build_cpus < 0:
        raise KfbotError("--build-cpus must be 0 or more")
    if args.executor == "ray":
        from kfbot.search.executors.ray import ray_module  # Ray only when asked for

        ray_module()
    if args.gpu is not None:
        if args.gpus is not None:
            raise KfbotError("--gpu and --gpus both given: use one of them")
        return [args.gpu]
    return choose_gpus(args.gpus, visible_gpus())


def _executor(task: KernelTask, engine: Engine, gpus: list[int]) -> Executor:
    if len(gpus) < 2:
        return EngineExecutor(engine)
    return LocalGpuExecutor(gpus, engines_per_gpu(task, engine.settings, first=engine))


def _key() -> str:
    return (credentials.original("ANTHROPIC_API_KEY") or "").strip()
