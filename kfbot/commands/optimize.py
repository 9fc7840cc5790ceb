"""`kfbot optimize [kernel]`: search for a faster verified kernel within a budget."""

from __future__ import annotations

import argparse
import contextlib
import functools
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kfbot import credentials
from kfbot.commands.common import cache_dir
from kfbot.config import load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK, KfbotError
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.steps import first_failure
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.archive import Individual
from kfbot.search.budget import Budget, Limits, parse_duration
from kfbot.search.executor import EngineExecutor, Executor, LocalGpuExecutor, engines_per_gpu
from kfbot.search.gpus import choose_gpus, visible_gpus
from kfbot.search.llm import NO_KEY_NOTICE, LlmMutator, LlmSettings
from kfbot.search.runner import (
    GpuFacts,
    OptimizeOutcome,
    OptimizeSettings,
    make_plan,
    optimize,
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("optimize", help="search for a faster, verified version of a kernel")
    p.add_argument("kernel", nargs="?", help="kernel name (default: every kernel with a "
                   "reference test, one after another)")
    p.add_argument("--repo", type=Path, default=Path("."), help="repository folder (default .)")
    p.add_argument("--config", type=Path, help="config file (default: kfbot.yaml if present)")
    p.add_argument("--budget-evals", type=int, default=64, metavar="N")
    p.add_argument("--time", type=_duration, default=None, metavar="DURATION",
                   help="wall-clock limit, e.g. 30m or 1h30m")
    p.add_argument("--islands", type=int, default=4)
    p.add_argument("--seed", type=int, default=None, help="default: a random seed, printed")
    p.add_argument("--resume", metavar="RUN_ID", help="continue a killed run")
    p.add_argument("--no-llm", action="store_true", help="params and rules mutators only")
    p.add_argument("--gpu", type=int, default=None, help="one GPU (same as --gpus N)")
    p.add_argument("--gpus", metavar="LIST", help="GPU indices to use, e.g. 0,2 "
                   "(default: every visible GPU, one evaluation worker each)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where evaluations run: this machine's GPUs, or a Ray cluster")
    p.add_argument("--address", metavar="ADDR",
                   help="the Ray cluster to join (with --executor ray; default: start one)")
    p.add_argument("--build-cpus", type=int, default=0, metavar="N",
                   help="with --executor ray: build as Ray tasks of N CPUs and no GPU, which "
                        "may run on CPU-only nodes (default 0: each GPU actor builds)")
    p.add_argument("--dry-run", action="store_true",
                   help="show what would be searched, without a GPU")
    pub = p.add_argument_group("publishing a verified winner (docs/publishing.md)")
    pub.add_argument("--publish", action="store_true",
                     help="push branch kfbot/<kernel> and open or update its pull request")
    pub.add_argument("--repo-slug", metavar="OWNER/NAME",
                     help="the GitHub repository (default: from the remote's URL)")
    pub.add_argument("--remote", default="origin", help="git remote to push to (default origin)")
    pub.add_argument("--draft", action="store_true", default=None,
                     help="open the pull request as a draft (default: github.draft)")
    pub.add_argument("--publish-dry-run", type=Path, metavar="DIR",
                     help="write the pull request body and diff to DIR; push nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.budget_evals < 1 or args.islands < 1:
        raise KfbotError("--budget-evals and --islands must be at least 1")
    gpus = _gpus(args)  # bad --gpus or a missing Ray: said before any scan or build
    root = args.repo.resolve()
    config = load_config(args.config, root)
    kernels = scan(root, config).kernels
    chosen = [select_kernel(kernels, args.kernel)] if args.kernel else \
        [k for k in kernels if k.references]
    if not chosen:
        raise KfbotError(f"{root}: no kernel with a reference test to optimize")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    settings = OptimizeSettings(islands=args.islands, seed=seed, evaluations=args.budget_evals,
                                seconds=args.time)
    console = Console()
    worst = EXIT_OK
    for kernel in chosen:
        task = make_task(kernel, root, config)
        worst = max(worst, _one(task, settings, args, console, gpus))
    return worst


def _one(task: KernelTask, settings: OptimizeSettings, args: argparse.Namespace,
         console: Console, gpus: list[int]) -> int:
    llm_state = "off (--no-llm)" if args.no_llm else \
        ("on" if _has_key() else NO_KEY_NOTICE.removeprefix("llm mutator off: "))
    for line in make_plan(task, settings, llm_state).lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if args.dry_run:
        return EXIT_OK
    run_id = args.resume or f"{task.kernel_name}-{settings.seed}"
    run_dir = task.root / ".kfbot" / "runs" / run_id
    llm = None if args.no_llm else LlmMutator.from_env(LlmSettings(), Budget(Limits()))
    search = functools.partial(_search, task, settings, run_dir, llm, console)
    engine_settings = EngineSettings(cache_dir=cache_dir(), gpu=gpus[0] if gpus else None)
    if args.executor == "ray":  # the GPUs are the cluster's: this machine may have none
        from kfbot.search.ray_executor import RayExecutor

        ray = RayExecutor(task, engine_settings, args.address, build_cpus=args.build_cpus)
        with contextlib.closing(ray):
            facts = ray.preflight()
            _require_baseline(task, facts.baseline)
            outcome = search(facts, ray)
    else:
        with Engine(task, engine_settings) as engine:
            engine.probe()  # no GPU: say so now, after the plan
            _require_baseline(task, engine.baseline())
            executor = _executor(task, engine, gpus)
            with contextlib.closing(executor):
                outcome = search(engine, executor)
    best = outcome.best
    console.print(f"stopped: {outcome.result.stopped}; spent {outcome.spent}", highlight=False)
    if best is None:
        console.print("no correct candidate beat the original", highlight=False)
        return EXIT_FAILURE
    console.print(f"best: {best.speedup or 0:.3f}x ({best.verdict}); run folder {run_dir}",
                  highlight=False)
    for what, path in outcome.files.items():
        console.print(f"  {what}: {path}", highlight=False)
    code = EXIT_OK if best.publishable else EXIT_FAILURE
    if args.publish or args.publish_dry_run:
        from kfbot.github.publish import publish_after_run  # PyGithub only when publishing

        published = publish_after_run(task, outcome, settings.islands, args)
        console.print(published.message, highlight=False, markup=False, soft_wrap=True)
        code = max(code, EXIT_FAILURE if published.operation == "skipped" else EXIT_OK)
    return code


def _require_baseline(task: KernelTask, base: Evaluation) -> None:
    failure = first_failure(base.steps)
    if failure is not None and failure.step != "comparison":
        raise KfbotError(f"{task.kernel_id}: the baseline stopped at the {failure.step} step: "
                         f"{failure.summary} (`kfbot verify {task.kernel_name} --explain` "
                         "shows the evidence)")
    if not base.ok:
        raise KfbotError(f"{task.kernel_id}: the original fails its own reference: "
                         f"{base.reason}. If that error is one the op may make, declare the "
                         "tolerance in kfbot.yaml (tasks: tolerances), which candidates are "
                         "then held to")


def _search(task: KernelTask, settings: OptimizeSettings, run_dir: Path,
            llm: LlmMutator | None, console: Console, gpu: GpuFacts,
            executor: Executor) -> OptimizeOutcome:
    """The search with its live view, one row per island."""
    view = _View(settings.islands)
    with Live(view.table(), console=console, refresh_per_second=4) as live:
        def shown(ind: Individual) -> None:
            view.add(ind)
            live.update(view.table())

        return optimize(task, gpu, settings, run_dir, llm, shown, executor)


def _gpus(args: argparse.Namespace) -> list[int]:
    """The GPUs to run workers on: --gpu, --gpus, or every visible one."""
    if args.address is not None and args.executor != "ray":
        raise KfbotError("--address is for --executor ray")
    if args.build_cpus and args.executor != "ray":
        raise KfbotError("--build-cpus is for --executor ray (local builds use every core)")
    if args.build_cpus < 0:
        raise KfbotError("--build-cpus must be 0 or more")
    if args.executor == "ray":
        from kfbot.search.ray_executor import ray_module  # Ray only when asked for

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


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _has_key() -> bool:
    return bool((credentials.original("ANTHROPIC_API_KEY") or "").strip())


@dataclass
class _Row:
    evaluations: int = 0
    best: float = 1.0
    failed: dict[str, int] = field(default_factory=dict)


class _View:
    """Per island: evaluations, best speedup, failures by stage."""

    def __init__(self, islands: int) -> None:
        self.rows = {i: _Row() for i in range(islands)}

    def add(self, ind: Individual) -> None:
        row = self.rows[ind.island]
        row.evaluations += 1
        if ind.fitness is not None:
            row.best = max(row.best, ind.fitness)
        else:
            row.failed[ind.stage] = row.failed.get(ind.stage, 0) + 1

    def table(self) -> Table:
        table = Table(title="kfbot optimize")
        for col in ("island", "evaluations", "best speedup", "failures by stage"):
            table.add_column(col)
        for i, row in self.rows.items():
            failed = ", ".join(f"{k} {v}" for k, v in sorted(row.failed.items())) or "-"
            table.add_row(str(i), str(row.evaluations), f"{row.best:.3f}x", failed)
        return table
