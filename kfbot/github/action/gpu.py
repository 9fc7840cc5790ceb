"""What the Action's GPU modes share: the worker must see a CUDA GPU before anything is
built, and a kernel named on the command line becomes a task and an engine."""

from __future__ import annotations

from pathlib import Path

from kfbot.cache import cache_dir
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.engine import JOBS, KFBOT_PARENT, Engine, EngineSettings
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.evaluate.worker.session import WorkerSession
from kfbot.github.action.context import Context
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.progress import build_heartbeat

GPU_HINT = ("run the workflow on a self-hosted runner with a CUDA GPU and the CUDA toolkit "
            "(`runs-on: [self-hosted, gpu]`)")


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


def engine_for(ctx: Context, task: KernelTask) -> Engine:
    return Engine(task, EngineSettings(cache_dir=cache_dir(), gpu=ctx.inputs.gpu,
                                       progress=build_heartbeat))
