"""The baseline, step by step: what each step found, and what would fix a failed one.

Before a candidate can be judged, the original must pass its own reference. That takes
six steps, and on a real repository any of them can fail for its own reason:

- pair: the scan found the tests or scripts that reach the kernel's op;
- build: kfbot built the extension the way the repository does;
- import: the repository's tests and scripts imported it (kfbot's build, staged under
  its real name);
- capture: running them recorded the op's real call signatures;
- reference: a pure-PyTorch reference was carried out of them;
- comparison: on the GPU, the original agrees with that reference.

A failed step is reported with a one-line summary, the last lines of the failing
process's output, and, where one exists, the `kfbot.yaml` snippet that gets around it.
`kfbot verify --explain` prints every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kfbot.scan.model import BuildRecipe

StepName = Literal["environment", "pair", "build", "import", "capture", "reference",
                   "comparison"]
Outcome = Literal["ok", "warning", "failed", "skipped"]

NO_REFERENCE = "checked against the original, no independent reference"


@dataclass(frozen=True)
class StepReport:
    step: StepName
    outcome: Outcome
    summary: str  # one line
    evidence: str = ""  # the last lines of the failing process's output, or the facts
    suggestion: str = ""  # a kfbot.yaml snippet that would get past this step

    def __post_init__(self) -> None:
        # Evidence is read by a person (terminal, report, PR body): a process that wrote
        # megabytes gives its last lines, each cut to a screen's width, within a bound.
        object.__setattr__(self, "evidence", bounded(self.evidence))

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"

    def line(self) -> str:
        return f"{self.step}: {self.summary}"

    def to_json(self) -> dict[str, str]:
        return {"step": self.step, "outcome": self.outcome, "summary": self.summary,
                "evidence": self.evidence, "suggestion": self.suggestion}


EVIDENCE_CHARS = 6000
LINE_CHARS = 400


def bounded(text: str, limit: int = EVIDENCE_CHARS, width: int = LINE_CHARS) -> str:
    """The end of `text` within `limit` characters, every line cut to `width`."""
    lines = [line if len(line) <= width else line[:width - 1] + "…"
             for line in text.splitlines()]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line) + 1
        if size > limit:
            break
        kept.append(line)
    return "\n".join(reversed(kept))


def first_failure(steps: tuple[StepReport, ...]) -> StepReport | None:
    return next((s for s in steps if s.failed), None)


def _task_head(kernel_id: str, name: str) -> list[str]:
    return ["tasks:", f"  - name: {name}", f"    kernel: {kernel_id}"]


def build_snippet(kernel_id: str, name: str, recipe: BuildRecipe,
                  files: tuple[str, ...] = ()) -> str:
    """`files`: the sources to list when the recipe's are not known (the kernel's)."""
    listed = ", ".join(recipe.sources or files or (recipe.file,))
    kind = recipe.kind if recipe.kind in ("load", "load_inline", "setup_py") else "load"
    flags = ", ".join(f'"{f}"' for f in recipe.extra_cuda_cflags) or '"-O3"'
    return "\n".join([
        *_task_head(kernel_id, name),
        "    build:",
        f"      kind: {kind}                  # load | load_inline | setup_py",
        f"      name: {recipe.name}",
        f"      sources: [{listed}]",
        f"      extra_cuda_cflags: [{flags}]  # every flag the repository passes",
    ])


def repository_build_snippet(kernel_id: str, name: str, file: str, library: str) -> str:
    """The repository builds itself with `file`; `library`, where one is known, is the
    module of a library it built (without it, the kernel's symbols choose)."""
    named = [f"      name: {library}    # the module of the library that holds the kernel"] \
        if library else []
    return "\n".join([
        *_task_head(kernel_id, name),
        "    build:",
        "      kind: repository              # the repository's own build, in a scratch copy",
        f"      file: {file}",
        *named,
        "repository_build:",
        "  timeout: 60m                     # the time the repository's own build may take",
    ])


def inputs_snippet(kernel_id: str, name: str) -> str:
    return "\n".join([
        *_task_head(kernel_id, name),
        "    shapes: [[4096], [1024, 1024]]     # the shapes the op really sees",
        "    dtypes: [float32]",
        '    inputs: "tests.inputs:make_inputs"  # optional: (shape, dtype) -> the op\'s args',
    ])


def reference_snippet(kernel_id: str, name: str) -> str:
    return "\n".join([
        *_task_head(kernel_id, name),
        '    reference: "tests.reference:op_reference"  # pure PyTorch, the op\'s arguments',
    ])
