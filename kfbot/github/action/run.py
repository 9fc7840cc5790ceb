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

import dataclasses
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path

from kfbot import git
from kfbot.errors import EXIT_FAILURE, EXIT_OK, KfbotError
from kfbot.github import action_io
from kfbot.github.action.comment import comment_mode
from kfbot.github.action.context import Context
from kfbot.github.action.guard import guard_mode
from kfbot.github.action.optimize import optimize_all
from kfbot.github.action.publish_job import publish_mode
from kfbot.github.action.scan import scan_result
from kfbot.github.action_io import Annotation, Result
from kfbot.github.events import CommentEvent, PullRequestEvent, load_event
from kfbot.github.handoff import Recorder
from kfbot.github.redaction import Redactor, redacted_streams
from kfbot.text import printable, utf8_safe

log = logging.getLogger(__name__)


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
