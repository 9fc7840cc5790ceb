"""The Actions runner's side of `kfbot action`: inputs, outputs, job summary, annotations.

The composite action passes each input as an `INPUT_<NAME>` variable in its step's
`env:` (`min-speedup` -> `INPUT_MIN_SPEEDUP`): the values never pass through a shell,
and every one is validated here, so a bad value is an error naming the input.
Workflow commands (`::error ...::`, `::add-mask::`) and the output file format follow
the runner's documented syntax, escaping included.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from kfbot.errors import KfbotError
from kfbot.search.budget import parse_duration, parse_percent
from kfbot.text import utf8_safe

COMMANDS = ("auto", "optimize", "scan", "guard", "authorize", "publish")

# GitHub refuses a step summary over 1 MiB; stay under it with room for the note.
SUMMARY_LIMIT = 1024 * 1024 - 4096


@dataclass(frozen=True)
class ActionInputs:
    command: str = "auto"  # auto: by event (comment command, PR guard, optimize otherwise)
    kernel: str = ""  # empty: every kernel with a reference test
    budget: int = 64  # evaluations per kernel
    time: float | None = None  # seconds per kernel
    islands: int = 4
    config: str = ""  # path relative to the workspace; empty: discovered
    token: str = ""
    anthropic_api_key: str = ""
    dry_run: bool = False
    min_speedup: float | None = None  # None: the config's github.min_speedup
    gpu: int | None = None
    head_sha: str = ""  # the pull request head an authorize job approved
    slowdown_threshold: float = 0.0  # guard: an input counts as slower beyond this (0.05)
    warn_only: bool = False  # guard: slowdowns are warnings, the step passes
    # The two-job split: the folder the GPU job hands its run over in (it then writes
    # nothing to GitHub), and the folder the publish job reads it from.
    artifact: str = ""


def _text(value: str) -> str:
    return value


def _positive_int(value: str) -> int:
    if not re.fullmatch(r"\d+", value) or int(value) < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return int(value)


def _gpu_index(value: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise ValueError(f"expected a GPU index (0, 1, ...), got {value!r}")
    return int(value)


def _boolean(value: str) -> bool:
    # The YAML 1.2 core schema's booleans, which is what `${{ inputs.x }}` renders.
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")
    return lowered == "true"


def _speedup(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"expected a number such as 1.05, got {value!r}") from None
    if not math.isfinite(number) or number < 1.0:
        raise ValueError(f"expected a speedup of at least 1.0, got {value!r}")
    return number


def _command(value: str) -> str:
    if value not in COMMANDS:
        raise ValueError(f"expected one of {', '.join(COMMANDS)}, got {value!r}")
    return value


def _relative_path(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"expected a path inside the repository, got {value!r}")
    return value


def _absolute_path(value: str) -> str:
    if not PurePosixPath(value).is_absolute():
        raise ValueError(f"expected an absolute path such as ${{{{ runner.temp }}}}/kfbot-run, "
                         f"got {value!r}")
    return value


def _sha(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{40}", value):
        raise ValueError(f"expected a full 40-character commit SHA, got {value!r}")
    return value


def _kernel(value: str) -> str:
    if any(ch.isspace() for ch in value):
        raise ValueError(f"expected one kernel name, got {value!r}")
    return value


# input name -> (ActionInputs field, converter). A blank value means "the default".
INPUTS: dict[str, tuple[str, Callable[[str], object]]] = {
    "command": ("command", _command),
    "kernel": ("kernel", _kernel),
    "budget": ("budget", _positive_int),
    "time": ("time", parse_duration),
    "islands": ("islands", _positive_int),
    "config": ("config", _relative_path),
    "token": ("token", _text),
    "anthropic-api-key": ("anthropic_api_key", _text),
    "dry-run": ("dry_run", _boolean),
    "min-speedup": ("min_speedup", _speedup),
    "gpu": ("gpu", _gpu_index),
    "head-sha": ("head_sha", _sha),
    "slowdown-threshold": ("slowdown_threshold", parse_percent),
    "warn-only": ("warn_only", _boolean),
    "artifact": ("artifact", _absolute_path),
}
# Inputs the composite action's shell steps use before kfbot runs (the interpreter
# that installs and starts it); kfbot itself never reads them.
STEP_ONLY_INPUTS = ("python",)
# Inputs the run step passes under a variable of their own, which the part of kfbot
# that obeys them reads (the sandbox: whether untrusted code may run without one).
ENV_INPUTS = {"allow-unsandboxed": "KFBOT_ALLOW_UNSANDBOXED"}
SECRET_INPUTS = ("token", "anthropic-api-key")


def env_name(input_name: str) -> str:
    return "INPUT_" + input_name.upper().replace("-", "_")


def read_inputs(env: Mapping[str, str]) -> ActionInputs:
    """The action's inputs from `INPUT_*` variables; a bad value names its input."""
    values: dict[str, object] = {}
    for name, (field_name, convert) in INPUTS.items():
        raw = env.get(env_name(name), "").strip()
        if not raw:
            continue
        try:
            values[field_name] = convert(raw)
        except ValueError as exc:
            shown = "the value given" if name in SECRET_INPUTS else str(exc)
            raise KfbotError(f"action input '{name}' ({env_name(name)}): {shown}") from None
    return ActionInputs(**values)  # type: ignore[arg-type]


# GitHub ends a job after 360 minutes unless its `timeout-minutes` says otherwise.
GITHUB_JOB_LIMIT_S = 360 * 60.0
# Of the `time` input, kept for what the job does besides kfbot's search: installing,
# publishing, the summary, uploading the run folder.
MARGIN_SHARE = 0.10
MARGIN_MIN_S = 120.0
MARGIN_MAX_S = 900.0


def search_seconds(time_input: float | None) -> float:
    """The seconds optimize may take of the job's `time` (GitHub's job limit when it is
    empty): that less a margin of 10 %, 2 to 15 minutes, and never less than half."""
    total = time_input if time_input is not None else GITHUB_JOB_LIMIT_S
    margin = min(max(MARGIN_SHARE * total, MARGIN_MIN_S), MARGIN_MAX_S)
    return max(total - margin, total / 2)


@dataclass(frozen=True)
class Result:
    """What a run did, for the summary, the outputs and the exit code."""

    headline: str  # the verdict, one line
    details: str = ""  # Markdown: a table, the usage, an explanation
    exit_code: int = 0
    pr_url: str = ""
    pr_number: int | None = None
    pr_operation: str = "none"  # created, updated or none
    best_speedup: float | None = None
    annotations: tuple[Annotation, ...] = ()
    authorized_head: str = ""  # command authorize: the head the GPU job may run on

    def outputs(self, report_path: str) -> dict[str, str]:
        speedup = f"{self.best_speedup:.3f}" if self.best_speedup is not None else ""
        return {"pr-url": self.pr_url, "pr-number": str(self.pr_number or ""),
                "pr-operation": self.pr_operation, "best-speedup": speedup,
                "report-path": report_path,
                "authorized": "true" if self.authorized_head else "false",
                "head-sha": self.authorized_head}


# ---- workflow commands ----------------------------------------------------------------

def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


Level = Literal["error", "warning", "notice"]


@dataclass(frozen=True)
class Annotation:
    level: Level
    message: str
    file: str | None = None
    line: int | None = None
    title: str | None = None

    def command(self) -> str:
        props = [(k, v) for k, v in (("file", self.file), ("line", self.line),
                                     ("title", self.title)) if v not in (None, "")]
        joined = ",".join(f"{k}={escape_property(str(v))}" for k, v in props)
        head = f"::{self.level} {joined}" if joined else f"::{self.level}"
        return utf8_safe(f"{head}::{escape_data(self.message)}")


# ---- files the runner reads ------------------------------------------------------------


def output_lines(values: Mapping[str, str]) -> str:
    """`$GITHUB_OUTPUT` text: the heredoc form, safe for any value, multi-line included."""
    chunks = []
    for name, value in ((utf8_safe(k), utf8_safe(v)) for k, v in values.items()):
        delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        while delimiter in value:  # would end the value early; practically never
            delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        chunks.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
    return "".join(chunks)


def write_outputs(path: Path | None, values: Mapping[str, str]) -> None:
    if path is not None:
        with path.open("a", encoding="utf-8") as out:
            out.write(output_lines(values))


def fit_summary(markdown: str, report_path: str | None) -> str:
    """The summary cut to fit GitHub's 1 MiB limit, with a note where it was cut."""
    markdown = utf8_safe(markdown)
    data = markdown.encode()
    if len(data) <= SUMMARY_LIMIT:
        return markdown
    kept = data[:SUMMARY_LIMIT].decode(errors="ignore")
    kept = kept[: kept.rfind("\n") + 1] or kept
    where = f"; the full report is `{report_path}`" if report_path else ""
    dropped = len(data) - len(kept.encode())
    return kept + f"\n> **Summary truncated**: {dropped} bytes left out{where}.\n"


def write_summary(path: Path | None, markdown: str, report_path: str | None) -> None:
    if path is not None:
        with path.open("a", encoding="utf-8") as out:
            out.write(fit_summary(markdown, report_path))
