"""The rules mutator's proposals: one candidate per rewrite that applies to the target.

Source rewrites see only the file that defines the target kernel (for a load_inline
`.py`, its CUDA string) and change only the kernel, the device functions only it
calls and its launches; other kernels in the same file are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kfbot.evaluate.candidate import Candidate
from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.catalogue import Rewrite, load_rewrites
from kfbot.search.rewrites.files import SourceFn, apply_to_file, cuda_text
from kfbot.search.rewrites.registry import PARAM_REWRITES, SOURCE_REWRITES, SourceRewrite
from kfbot.search.rewrites.syntax import Target


def propose_rewrites(files: Mapping[str, str], editable: Sequence[str], parent: Candidate,
                     kernel: str, rewrites: Sequence[Rewrite] | None = None,
                     rtol: float | None = None) -> list[Candidate]:
    """One candidate per rewrite that applies to the kernel's file (or to the params),
    in the order of `rewrites` (default: the shipped ones, structural ones first)."""
    chosen = load_rewrites() if rewrites is None else rewrites
    paths = [p for p in editable if p in files]
    home, target = locate(files, paths, kernel, rtol)
    out: list[Candidate] = []
    for rewrite in chosen:
        rationale = f"{rewrite.id}: {rewrite.what}"
        if rewrite.rewrite in PARAM_REWRITES:
            params = PARAM_REWRITES[rewrite.rewrite]({p: files[p] for p in paths}, parent.params)
            if params is not None:
                out.append(Candidate(files=dict(parent.files), params=params, origin="rules",
                                     parent=parent.hash, rationale=rationale))
            continue
        if home is None:
            continue
        new = apply_to_file(_bound(SOURCE_REWRITES[rewrite.rewrite], target), home, files[home])
        if new is not None and new != files[home]:
            out.append(Candidate(files={**parent.files, home: new}, params=dict(parent.params),
                                 origin="rules", parent=parent.hash, rationale=rationale))
    return out


def _bound(fn: SourceRewrite, target: Target) -> SourceFn:
    return lambda source: fn(source, target)


def locate(files: Mapping[str, str], paths: Sequence[str], kernel: str,
           rtol: float | None = None) -> tuple[str | None, Target]:
    """The one editable file that defines `kernel` (None: none or several), and the
    target, which says whether another file launches it."""
    name = kernel.rsplit("::", 1)[-1]
    homes, launchers = [], []
    for path in paths:
        code = cuda_text(path, files[path])
        if code is None:
            continue
        root = sx.parse(code)
        if sx.kernels_named(root, name):
            homes.append(path)
        if sx.launches(root, name):
            launchers.append(path)
    home = homes[0] if len(homes) == 1 else None
    elsewhere = any(p != home for p in launchers)
    return home, Target(kernel=name, launched_elsewhere=elsewhere, rtol=rtol)
