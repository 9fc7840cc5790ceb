"""`kfbot action` with `command: publish`: the publish job of the two-job workflow.

The job that runs the repository's code and the candidates holds no token that can
write to GitHub; it uploads what it found as an artifact (`github.handoff`). This job
runs on a GitHub-hosted runner, checks nothing out and runs nothing of the repository:
it reads the artifact as untrusted input, re-checks each winner against the repository
through the API and commits it with the Git Data API (`github.from_handoff`), then
writes what the GPU job could not: the pull requests, the status comment and the
reaction. The pull request and the commands come from the event itself, never from
the artifact, and its base must still be the commit the run measured on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from github.Repository import Repository

from kfbot.config import GithubConfig
from kfbot.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, KfbotError
from kfbot.github.action.context import Context
from kfbot.github.action_io import Result
from kfbot.github.api import DEFAULT_RETRY, call
from kfbot.github.authorize import policy_on_default_branch, read_head
from kfbot.github.comments import RUNS_CODE, CommandError, command_line, parse_command
from kfbot.github.events import (
    CommentEvent,
    DispatchEvent,
    Event,
    PullRequestEvent,
    ScheduleEvent,
    load_event,
)
from kfbot.github.from_handoff import Pin, publish_handed
from kfbot.github.handoff import HandoffError, Manifest, read_manifest, read_publication
from kfbot.github.publish import PublishResult, PublishSettings, Target
from kfbot.github.recheck import Refusal
from kfbot.github.status import StatusReport, withheld


@dataclass(frozen=True)
class Published:
    """What became of one publication of the artifact."""

    name: str
    kernel: str
    outcome: PublishResult | Refusal

    def line(self) -> str:
        if isinstance(self.outcome, Refusal):
            return f"✗ {self.kernel}: refused: {self.outcome.reason}"
        mark = "✓" if self.outcome.url else "–"
        return f"{mark} {self.kernel}: {self.outcome.message}"


def publish_mode(ctx: Context) -> Result:
    """Publish the artifact's winners and post the status the GPU job left behind."""
    if not ctx.inputs.artifact:
        raise KfbotError("action input 'artifact': command publish reads the GPU job's "
                         "artifact: give the folder actions/download-artifact wrote it to",
                         EXIT_USAGE)
    event = load_event(ctx.event_name, ctx.event_path, ctx.repository)
    repo = ctx.github()
    folder = Path(ctx.inputs.artifact)
    try:
        manifest = read_manifest(folder)
        _same_run(manifest, ctx)
    except HandoffError as exc:
        result = Result(f"nothing to publish: {exc}", exit_code=EXIT_FAILURE)
        _post(ctx, repo, event, _lost_report(ctx, exc), False)
        return result
    done = _publish_all(ctx, repo, event, manifest, folder)
    result = _result(manifest, done)
    if manifest.status is not None:
        report = _report(ctx, event, manifest.status, result, done)
        _post(ctx, repo, event, report, manifest.status_if_exists)
    return result


def _same_run(manifest: Manifest, ctx: Context) -> None:
    """The artifact is of this workflow run: its repository, event and run."""
    run_id = ctx.env.get("GITHUB_RUN_ID", "")
    for what, theirs, ours in (("repository", manifest.repository, ctx.repository),
                               ("event", manifest.event, ctx.event_name),
                               ("run", manifest.run_id, run_id)):
        if theirs != ours:
            raise HandoffError(f"the artifact is of {what} {theirs!r}, this job's is {ours!r}: "
                               "download the artifact of this workflow run")


def _publish_all(ctx: Context, repo: Repository, event: Event, manifest: Manifest,
                 folder: Path) -> list[Published]:
    if not manifest.publications:
        return []
    found = _pin(ctx, repo, event, manifest)
    done = []
    for name in manifest.publications:
        handed = read_publication(folder, name)
        kernel = handed.publication.kernel_name if handed.publication else name
        if isinstance(found, str):
            done.append(Published(name, kernel, Refusal(name, found)))
            continue
        pin, policy = found
        settings = _settings(ctx, policy)
        target = Target(repo, ctx.repository, pin.branch)
        done.append(Published(name, kernel, publish_handed(handed, pin, target, settings)))
    return done


def _pin(ctx: Context, repo: Repository, event: Event, manifest: Manifest
         ) -> tuple[Pin, GithubConfig] | str:
    """Where the winners go and the commit they must still be on, from the event and
    the policy on the default branch; or why nothing may be published."""
    if manifest.head is None:
        return "the GPU job recorded no checked-out commit"
    policy = ctx.github_config(policy_on_default_branch(repo, ctx.inputs.config or None,
                                                         DEFAULT_RETRY))
    if isinstance(event, CommentEvent):
        approved = ctx.inputs.head_sha
        if not approved:
            return ("a comment command publishes only on the head an authorize job pinned: "
                    "pass its head-sha output as the head-sha input")
        if manifest.head != approved:
            return (f"the GPU job ran on {manifest.head[:7]}, not on the authorized head "
                    f"{approved[:7]}")
        head = read_head(repo, event.number, DEFAULT_RETRY)
        # A fork's branch is out of reach: then to the pull request's base.
        branch = head.base_ref if head.fork else head.ref
        return Pin(approved, branch, event.number), dataclasses.replace(policy, base=branch)
    if isinstance(event, (ScheduleEvent, DispatchEvent)):
        return Pin(manifest.head, policy.base or repo.default_branch), policy
    return f"a {ctx.event_name} run publishes no pull request"


def _settings(ctx: Context, policy: GithubConfig) -> PublishSettings:
    read, write = ctx.intervals()
    return PublishSettings(github=policy, repo_slug=ctx.repository, token=ctx.token(),
                           env=ctx.env, read_interval=read, write_interval=write,
                           redact=ctx.redact)


def _result(manifest: Manifest, done: list[Published]) -> Result:
    handed = manifest.result
    if not done:
        return Result(handed.headline, handed.details, EXIT_OK,
                      best_speedup=handed.best_speedup)
    lines = "\n".join(f"- {p.line()}" for p in done)
    details = f"{handed.details.rstrip()}\n\n## Published\n\n{lines}\n".lstrip()
    refused = [p for p in done if isinstance(p.outcome, Refusal)]
    published = [p.outcome for p in done if isinstance(p.outcome, PublishResult)]
    first = next((r for r in published if r.url), None)
    headline = done[0].line()[2:] if len(done) == 1 else \
        f"{sum(1 for r in published if r.url)} of {len(done)} winners published"
    return Result(headline, details, EXIT_FAILURE if refused else EXIT_OK,
                  pr_url=first.url or "" if first else "",
                  pr_number=first.number if first else None,
                  pr_operation=first.operation if first else "none",
                  best_speedup=handed.best_speedup)


def _report(ctx: Context, event: Event, handed: StatusReport, result: Result,
            done: list[Published]) -> StatusReport:
    """The GPU job's last word, with what the event says about who asked for what (the
    artifact does not decide that) and what became of the winners."""
    report = dataclasses.replace(handed, run_url=ctx.run_url(), steps=list(handed.steps))
    if isinstance(event, CommentEvent):
        report.command = command_line(event.body) or report.command
        report.requester = event.author
    report.steps += [p.line() for p in done]
    if done:
        report.headline = result.headline
        if result.exit_code != EXIT_OK:
            report.state = "failed"
    return report


def _lost_report(ctx: Context, exc: HandoffError) -> StatusReport:
    return StatusReport("kfbot", None, run_url=ctx.run_url(), state="failed",
                        headline="the GPU job left no result to publish",
                        details=f"{exc}. The run's log says why.")


def _post(ctx: Context, repo: Repository, event: Event, report: StatusReport,
          only_if_exists: bool) -> None:
    """The status comment of the command or the guard, and the comment's reaction."""
    if isinstance(event, CommentEvent):
        if not command_line(event.body):
            return
        report.command = command_line(event.body) or report.command
        report.requester = event.author
        key = _command_key(event.body)
        status = ctx.status(repo, event.number, key)
        fork = key.split(":")[0] in RUNS_CODE and read_head(repo, event.number,
                                                           DEFAULT_RETRY).fork
        status.show(withheld(report) if fork else report)
        _react(repo, event, "rocket" if report.state == "done" else "confused")
    elif isinstance(event, PullRequestEvent):
        status = ctx.status(repo, event.number, "guard")
        shown = withheld(report) if event.from_fork else report
        if only_if_exists:
            status.show_if_exists(shown)
        else:
            status.show(shown)


def _command_key(body: str) -> str:
    """The status comment's key, as the authorize job named it: from the comment."""
    try:
        return parse_command(command_line(body) or "").key
    except CommandError:
        return "usage"


def _react(repo: Repository, event: CommentEvent, content: str) -> None:
    number, cid = event.number, event.comment_id
    issue = call(lambda: repo.get_issue(number), f"reading #{number}", DEFAULT_RETRY)
    comment = call(lambda: issue.get_comment(cid), f"reading comment {cid}", DEFAULT_RETRY)
    call(lambda: comment.create_reaction(content), f"reacting {content}", DEFAULT_RETRY)
