"""Reproduce a run's reported speedup from its committed patch alone.

    figures = reproduce(Request(...), cache_dir=...)   # a Reproduction

Nothing of the search is reused but the compiler cache, which is keyed by content and
flags: the base commit is checked out twice into temporary worktrees (the user's
checkout is never touched), the patch is applied to one of them with `git apply`, each
copy is scanned afresh (so only the build flags its own files hold apply, never a
candidate's parameters), both are built the way the repository builds them, and a
fresh worker times them with the second timer (`device.retime`) on new inputs of the
run's benchmark shapes, after checking the patched op still computes the right thing.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kfbot import git
from kfbot.config import load_config
from kfbot.errors import EXIT_FAILURE, EXIT_USAGE, KfbotError
from kfbot.evaluate.build import BuildResult
from kfbot.evaluate.candidate import ORIGINAL
from kfbot.evaluate.candidate_files import patched_paths
from kfbot.evaluate.engine import JOBS, Engine, EngineSettings
from kfbot.evaluate.reproduce.model import Reproduction, Request, ShapeFigures
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.paths import plain_relative
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

SEEDS = 3  # argument sets per shape, rotated through the timed calls
METHOD = ("CUDA events around each call, the L2 flushed by a read queued just before it, "
          "original and candidate alternating ABBA, batches of calls queued then read")


def reproduce(request: Request, cache_dir: Path, gpu: int | None = None,
              job_timeout_s: float = 900.0) -> Reproduction:
    """The second timer's figures for the patch; a `KfbotError` when it cannot be had
    (exit 2: the run folder does not fit this repository; 1: the patch does not apply
    or build; 3: no GPU)."""
    top = _repository(request)
    with _trees(top, request) as (before, after):
        original, candidate = _task(before, request), _task(after, request)
        settings = EngineSettings(cache_dir=cache_dir, gpu=gpu, job_timeout_s=job_timeout_s)
        with Engine(original, settings) as engine, Engine(candidate, settings) as patched:
            engine.probe()  # no GPU: said before minutes of builds
            built = (_built(engine, "the base commit", "rpbase"),
                     _built(patched, "the patched copy", f"rp{request.candidate[:8]}"))
            job = engine.session.call(f"{JOBS}:reproduce", _payload(original, built, request),
                                      timeout_s=job_timeout_s)
    if not job.ok or job.value is None:
        raise KfbotError(f"the timing worker failed: {job.reason}", EXIT_FAILURE)
    return _figures(request, job.value)


def _repository(request: Request) -> Path:
    place = git.locate(request.repository)
    if request.changed:
        raise KfbotError(f"the run started from uncommitted changes ({', '.join(request.changed)})"
                         f" to commit {request.commit[:10]}: its figures were measured against "
                         "those, which the commit does not hold; commit them and search again",
                         EXIT_USAGE)
    if git.commit_of(place.top, request.commit) is None:
        raise KfbotError(f"commit {request.commit[:10]}, where the run started, is not in the "
                         f"repository at {place.top}: reproduce in the clone the run was made in",
                         EXIT_USAGE)
    return place.top


@contextlib.contextmanager
def _trees(top: Path, request: Request) -> Iterator[tuple[Path, Path]]:
    """Two clean checkouts of the commit, the second with the patch applied; the kernel's
    folder in each."""
    with tempfile.TemporaryDirectory(prefix="kfbot-reproduce-") as tmp:
        trees = [Path(tmp) / "base", Path(tmp) / "patched"]
        added: list[Path] = []
        try:
            for tree in trees:
                git.run(top, "worktree", "add", "--quiet", "--detach", str(tree), request.commit)
                added.append(tree)
            _apply(trees[1], request)
            yield trees[0] / request.prefix, trees[1] / request.prefix
        finally:
            for tree in added:
                git.run(top, "worktree", "remove", "--force", str(tree))


def _apply(tree: Path, request: Request) -> None:
    # The run folder may come from elsewhere (an artifact): its names stay in the tree.
    if request.prefix:
        plain_relative(request.prefix.rstrip("/"), "the run's repository folder")
    patched_paths(request.patch, "the run's patch")
    patch = tree.parent / "best.patch"
    patch.write_text(request.patch, encoding="utf-8")
    where = [f"--directory={request.prefix.rstrip('/')}"] if request.prefix else []
    try:
        git.run(tree, "apply", "--whitespace=nowarn", *where, str(patch))
    except git.GitError as exc:
        raise KfbotError(f"the run's patch does not apply to commit {request.commit[:10]}: "
                         f"{exc}", EXIT_FAILURE) from exc


def _task(root: Path, request: Request) -> KernelTask:
    config = load_config(None, root)
    kernels = scan(root, config).kernels
    return make_task(select_kernel(kernels, request.kernel_id), root, config, kernels)


def _built(engine: Engine, what: str, tag: str) -> BuildResult:
    """The copy's own build. Its own tag: two builds of one extension name must not
    share a module name or a TORCH_LIBRARY namespace in one worker."""
    if engine.task.build.kind == "repository":
        raise KfbotError(f"{what}: reproducing a run needs kfbot's own build of the "
                         "extension; this repository builds itself (its setup.py or CMake)",
                         EXIT_FAILURE)
    result = engine.builder.build(replace(engine.request(ORIGINAL), tag=tag))
    if not result.ok:
        first = next((d.message for d in result.diagnostics if d.severity == "error"),
                     f"failed at the {result.stage} stage")
        raise KfbotError(f"{what} does not build: {first}", EXIT_FAILURE)
    return result


def _payload(task: KernelTask, built: tuple[BuildResult, BuildResult],
             request: Request) -> dict[str, Any]:
    return {
        "op": task.op.to_json(),
        "original": _artifact(built[0]),
        "candidate": _artifact(built[1]),
        "references": [r.to_json() for r in task.references],
        "tolerances": {k: list(v) for k, v in task.tolerances.items()},
        "shapes": [{"label": s.label, "signature": s.signature.to_json()}
                   for s in request.shapes],
        "seeds": [secrets.randbits(48) for _ in range(SEEDS)],
        "sys_path": [str(task.root)],
    }


def _artifact(result: BuildResult) -> dict[str, Any]:
    return {"artifact": str(result.artifact), "module_name": result.module_name,
            "namespaces": dict(result.library_namespaces)}


def _figures(request: Request, value: Mapping[str, Any]) -> Reproduction:
    reported = {s.label: s.reported for s in request.shapes}
    shapes = []
    for entry in value.get("shapes", []):
        if entry.get("error"):
            raise KfbotError(f"the patched op is wrong on {entry['label']}: {entry['error']}",
                             EXIT_FAILURE)
        original, candidate = _median(entry["original_us"]), _median(entry["candidate_us"])
        shapes.append(ShapeFigures(entry["label"], reported[entry["label"]],
                                   original / candidate, original, candidate,
                                   len(entry["candidate_us"])))
    return Reproduction(request.candidate, tuple(shapes),
                        f"{METHOD}; commit {request.commit[:10]} + the patch, fresh process",
                        dict(value.get("environment", {})))


def _median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))
