"""The Action's comment mode: a `/kfbot` command on a pull request, answered on the
checkout of its head (or, in a job that hands its run over, recorded for the publish job)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kfbot.config import GithubConfig
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.github.action.context import Context
from kfbot.github.action.gpu import engine_for, require_gpu, task_for
from kfbot.github.action.optimize import asked_search, optimize_kernel
from kfbot.github.action.scan import scan_result
from kfbot.github.action_io import Result
from kfbot.github.api import DEFAULT_RETRY
from kfbot.github.authorize import Head, policy_on_default_branch
from kfbot.github.comments import (
    Command,
    Settings,
    answer_handed,
    handle_comment,
    ignored_because,
)
from kfbot.github.events import CommentEvent


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
        from kfbot.evaluate.render import to_markdown as evaluation_markdown
        from kfbot.evaluate.render import verdict_line

        task = task_for(self.ctx, command.kernel or "")
        require_gpu(self.ctx.root, self.ctx.inputs.gpu)
        with engine_for(self.ctx, task) as engine:
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
                               asked_search(self.ctx.inputs, command), github,
                               before_publish, progress)
