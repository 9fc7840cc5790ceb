"""`kfbot hook verify [FILES...]`: the GPU pre-commit hook, for the manual or pre-push stage.

Every kernel the change touches is built from the working tree and verified against
its reference, then timed against its version at the base revision (HEAD, or at
pre-push the remote's old commit, which pre-commit passes as PRE_COMMIT_FROM_REF).

Exit codes: 0 every changed kernel is correct (slower ones are warned about), or
nothing to verify, or no GPU here (skipped, said in one line); 1 a kernel failed to
build or verify, or with --fail-on-slower got significantly slower on some input;
2 bad usage; 3 no GPU, torch or nvcc and --require-gpu was given.

`hook` takes the hook's name as a word of its own (`kfbot hook verify`), so that the
pre-commit entry reads as what it does and `kfbot check` stays the light hook.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from kfbot import extras
from kfbot.cache import cache_dir
from kfbot.commands.options import add_repo_arguments, percent_argument
from kfbot.config import load_config
from kfbot.errors import EXIT_FAILURE, EXIT_MISSING_TOOL, EXIT_OK, KfbotError
from kfbot.evaluate.against_base import Comparison, compare_with_base
from kfbot.evaluate.evaluation import Evaluation
from kfbot.scan.changes import (
    ChangedKernel,
    by_op,
    changed_kernels,
    changed_paths,
    given_paths,
    is_kernel_source,
)
from kfbot.scan.scanner import scan

# Set by pre-commit for pre-push hooks: the commit the remote had before the push.
FROM_REF_ENV = "PRE_COMMIT_FROM_REF"

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hook", help="pre-commit hooks that need a GPU (see also: kfbot check)")
    hooks = p.add_subparsers(dest="hook", required=True)
    v = hooks.add_parser("verify", help="verify changed kernels against their reference and "
                                        "time them against the base revision (GPU)")
    v.add_argument("files", nargs="*", type=Path,
                   help="changed files (default: every file changed since --base)")
    add_repo_arguments(v)
    v.add_argument("--base", default=None, metavar="REV",
                   help=f"revision to compare with (default: ${FROM_REF_ENV} when pre-commit "
                        "runs it at pre-push, else HEAD)")
    v.add_argument("--gpu", type=int, default=None, metavar="N",
                   help="GPU index (default: the first)")
    v.add_argument("--fail-on-slower", action="store_true",
                   help="fail when a kernel got significantly slower on some input "
                        "(default: warn only)")
    v.add_argument("--slowdown-threshold", type=percent_argument, default=0.0, metavar="PCT",
                   help="count an input as slower only when it is significantly slower by "
                        "more than this, e.g. 5%% (default: 0%%, any significant slowdown)")
    v.add_argument("--require-gpu", action="store_true",
                   help="exit 3 when there is no GPU, torch or nvcc (default: skip, exit 0)")
    v.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = args.repo.resolve()
    base = args.base or os.environ.get(FROM_REF_ENV) or "HEAD"
    paths = given_paths(root, args.files) if args.files else changed_paths(root, base)
    paths = [p for p in paths if is_kernel_source(p)]
    config = load_config(args.config, root)
    changed = changed_kernels(root, base, paths, scan(root, config)) if paths else []
    log.info("against %s: %d kernel sources changed, %d kernels touched", base, len(paths),
             len(changed))
    if not changed:
        print("kfbot hook verify: no kernel changed: nothing to verify")
        return EXIT_OK
    missing = missing_gpu()
    if missing is not None:
        return _skipped(missing, changed, args.require_gpu)
    print(f"kfbot hook verify: {len(changed)} changed kernel"
          f"{'s' if len(changed) != 1 else ''} against {base}")
    failed = False
    for group in by_op(changed):
        item = ChangedKernel(group[0].kernel, tuple(sorted({f for g in group for f in g.files})))
        name = ", ".join(_name(g) for g in group)
        try:
            comparison = compare_with_base(root, base, item, args.gpu, cache_dir(),
                                           config if args.config else None)
        except KfbotError as exc:
            if exc.exit_code == EXIT_MISSING_TOOL:
                return _skipped(str(exc), changed, args.require_gpu)
            print(f"{name}: not verified: {exc}")
            continue
        failed |= report(name, comparison, base, args.fail_on_slower, args.slowdown_threshold)
    return EXIT_FAILURE if failed else EXIT_OK


def missing_gpu() -> str | None:
    """Why kernels cannot run here, found without starting anything; None when they may.
    The engine's own probe (a worker with torch) has the last word."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed for {sys.executable} ({extras.install_line('gpu')})"
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return "no NVIDIA driver on this machine"
    from kfbot.evaluate.build import find_toolkit

    try:
        find_toolkit()
    except KfbotError as exc:
        return str(exc)
    return None


def _skipped(why: str, changed: Sequence[ChangedKernel], required: bool) -> int:
    names = ", ".join(_name(c) for c in changed)
    if required:
        raise KfbotError(f"cannot verify {names}: {why}", EXIT_MISSING_TOOL)
    print(f"kfbot hook verify: skipped ({why}); not verified: {names}")
    return EXIT_OK


def _name(item: ChangedKernel) -> str:
    return item.kernel.definition.qualified_name


def report(name: str, comparison: Comparison, base: str, fail_on_slower: bool,
           threshold: float = 0.0) -> bool:
    """Print what the comparison of the op of kernels `name` found; True when the hook
    should fail for it."""
    change = comparison.change
    if comparison.note:
        print(f"{name}: verified on its own: {comparison.note}")
    if not change.ok:
        print(f"{name}: FAILED at {change.stage}: {change.reason}")
        for d in [d for d in change.diagnostics if d.severity == "error"][:5]:
            print(f"  {d.file or '?'}:{d.line or 0}: {d.message}")
        return True
    print(f"{name}: {_summary(change, base)}")
    slower = comparison.slower_beyond(threshold)
    if slower:
        mark = "FAILED" if fail_on_slower else "WARNING"
        beyond = f" by more than {threshold:.0%}" if threshold else ""
        print(f"{name}: {mark}: significantly slower than at {base}{beyond} on {len(slower)} "
              f"of {len(change.timings)} inputs:")
        for t in change.timings:
            if t.input in slower:
                s = t.speedup
                print(f"  {t.input}: {s.ratio:.2f}x (95% CI {s.ci_low:.2f}-{s.ci_high:.2f}; "
                      f"{s.baseline.median:.2f} -> {s.candidate.median:.2f} us)")
    return bool(slower) and fail_on_slower


def _summary(change: Evaluation, base: str) -> str:
    checks = f"correct on {len(change.checks)} checks"
    if change.speedup is None:
        return checks
    return (f"{checks}; {change.speedup:.2f}x the speed at {base} ({change.verdict}; "
            f"geometric mean over {len(change.timings)} inputs)")
