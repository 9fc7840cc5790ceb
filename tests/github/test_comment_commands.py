"""`/kfbot` comment commands: the grammar, the event payloads, and answering a comment
end to end through `kfbot action` against the fake GitHub server and real git remotes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_action import EVENTS, REPO, Harness, started_harness

from kfbot.config import GithubConfig
from kfbot.errors import KfbotError
from kfbot.github.action_io import Result
from kfbot.github.api import Retry, connect, repository
from kfbot.github.authorize import Head, HeadMoved, check_head, pin_head, read_head
from kfbot.github.comments import (
    USAGE,
    Command,
    CommandError,
    Settings,
    command_line,
    handle_comment,
    ignored_because,
    parse_command,
)
from kfbot.github.events import (
    CommentEvent,
    DispatchEvent,
    PullRequestEvent,
    ScheduleEvent,
    load_event,
)
from kfbot.github.markers import find_status_marker

SHA = "9f3c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e"


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Iterator[Harness]:
    """A git remote with a pull request, its checkout and the fake GitHub (test_action.py)."""
    yield from started_harness(tmp_path, monkeypatch, capsys)


# ---- grammar -------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "line"), [
    ("/kfbot scan", "/kfbot scan"),
    ("  /kfbot   optimize softmax_kernel\r\nthanks!", "/kfbot   optimize softmax_kernel"),
    ("\n\n/kfbot help\n/kfbot scan", "/kfbot help"),
    ("please /kfbot scan", None),
    ("/kfbotscan", None),
    ("> /kfbot scan (quoting someone)", None),
    ("", None),
])
def test_only_a_first_line_starting_with_the_word_is_a_command(body: str,
                                                                line: str | None) -> None:
    assert command_line(body) == line


def test_optimize_with_every_option() -> None:
    command = parse_command(f"/kfbot optimize csrc/softmax.cu::softmax_kernel budget=8 "
                            f"time=1h30m islands=2 sha={SHA}")
    assert command == Command("optimize", "csrc/softmax.cu::softmax_kernel", budget=8,
                              time=5400.0, islands=2, sha=SHA)
    assert command.key == "optimize:csrc/softmax.cu::softmax_kernel"


@pytest.mark.parametrize(("line", "expected"), [
    ("/kfbot", Command("help")),
    ("/kfbot help", Command("help")),
    ("/kfbot SCAN", Command("scan")),
    (f"/kfbot scan sha={SHA}", Command("scan", sha=SHA)),
    ("/kfbot bench ns::saxpy_kernel", Command("bench", "ns::saxpy_kernel")),
])
def test_commands(line: str, expected: Command) -> None:
    assert parse_command(line) == expected


@pytest.mark.parametrize(("line", "message"), [
    ("/kfbot optimise softmax_kernel", "unknown command `optimise`; did you mean `optimize`?"),
    ("/kfbot deploy", "unknown command `deploy`"),
    ("/kfbot optimize", "`/kfbot optimize` needs a kernel name"),
    ("/kfbot bench budget=3", "`/kfbot bench` needs a kernel name"),
    ("/kfbot optimize softmax_kernel budget=lots", "`budget=lots`: expected a whole number "
                                                   "from 1 to 5000"),
    ("/kfbot optimize softmax_kernel budget=0", "expected a whole number from 1 to 5000"),
    ("/kfbot optimize softmax_kernel islands=99", "`islands=99`: expected a whole number "
                                                  "from 1 to 32"),
    ("/kfbot optimize softmax_kernel time=soon", "`time=soon`: not a duration"),
    ("/kfbot optimize softmax_kernel time=48h", "`time=48h`: at most 24h"),
    ("/kfbot optimize softmax_kernel sha=abc123", "expected the full 40-character commit SHA"),
    ("/kfbot optimize softmax_kernel budget=3 budget=4", "option `budget` given twice"),
    ("/kfbot optimize softmax_kernel fast", "unexpected `fast`: options are written key=value"),
    ("/kfbot scan budget=3", "unknown option `budget` for `/kfbot scan` (accepted: `sha=`)"),
    ("/kfbot help me", "unexpected `me`"),
    ("/kfbot optimize $(rm -rf /)", "is not a kernel name"),
])
def test_bad_commands_say_what_is_wrong(line: str, message: str) -> None:
    with pytest.raises(CommandError) as caught:
        parse_command(line)
    assert message in str(caught.value)


# ---- event payloads ------------------------------------------------------------------------


def test_recorded_comment_payload() -> None:
    event = load_event("issue_comment", EVENTS / "issue_comment.created.json", "x/y")
    assert event == CommentEvent("created", REPO, 7, True, 2592861844,
                                 "/kfbot scan\r\n\r\nplease list the kernels", "alice", "User")
    assert ignored_because(event) is None


@pytest.mark.parametrize(("fixture", "why"), [
    ("issue_comment.edited.json", "the comment was edited, not created"),
    ("issue_comment.created.on_issue.json", "#3 is an issue, not a pull request"),
    ("issue_comment.created.by_bot.json", "the comment is from a bot (@github-actions[bot])"),
])
def test_comments_kfbot_stays_silent_on(fixture: str, why: str) -> None:
    event = load_event("issue_comment", EVENTS / fixture, REPO)
    assert ignored_because(event) == why


def test_kfbots_own_comment_is_ignored_even_from_a_user_account() -> None:
    event = load_event("issue_comment", EVENTS / "issue_comment.created.by_bot.json", REPO)
    assert isinstance(event, CommentEvent)
    as_user = CommentEvent(event.action, event.repository, event.number, True,
                           event.comment_id, event.body, "kfbot-pat-user", "User")
    assert ignored_because(as_user) == "the comment is kfbot's own"
    assert find_status_marker(event.body) is not None


def test_recorded_pull_request_payloads() -> None:
    same = load_event("pull_request", EVENTS / "pull_request.synchronize.json", REPO)
    fork = load_event("pull_request", EVENTS / "pull_request.opened.fork.json", REPO)
    assert isinstance(same, PullRequestEvent) and isinstance(fork, PullRequestEvent)
    assert (same.action, same.number, same.head_ref, same.base_ref) == \
        ("synchronize", 7, "softmax-block-per-row", "main")
    assert not same.from_fork
    assert fork.from_fork and fork.head_repository == "mallory/kernels-demo"


def test_schedule_and_dispatch_payloads() -> None:
    assert load_event("schedule", EVENTS / "schedule.json", "x/y") == \
        ScheduleEvent(REPO, "17 3 * * 1")
    assert load_event("workflow_dispatch", EVENTS / "workflow_dispatch.json", "x/y") == \
        DispatchEvent(REPO, "refs/heads/main", {"command": "scan", "kernel": ""})


@pytest.mark.parametrize(("fixture", "message"), [
    ("issue_comment.truncated.json", "issue_comment.truncated.json: not a valid event "
                                     "payload: invalid JSON at line "),
    ("issue_comment.no_user.json", "issue_comment.no_user.json: comment.user.login: missing "
                                   "from the event payload"),
    ("no_such_event.json", "no_such_event.json: event file not found (GITHUB_EVENT_PATH)"),
])
def test_malformed_payloads_name_the_file_and_the_problem(fixture: str, message: str) -> None:
    with pytest.raises(KfbotError) as caught:
        load_event("issue_comment", EVENTS / fixture, REPO)
    assert message in str(caught.value)


def test_wrong_types_and_shas_in_payloads(tmp_path: Path) -> None:
    payload = json.loads((EVENTS / "pull_request.synchronize.json").read_text())
    payload["pull_request"]["number"] = "7"
    (tmp_path / "a.json").write_text(json.dumps(payload))
    with pytest.raises(KfbotError, match=r"a.json: pull_request.number: expected an integer, "
                                         r"got \"7\""):
        load_event("pull_request", tmp_path / "a.json", REPO)
    payload["pull_request"]["number"] = 7
    payload["pull_request"]["head"]["sha"] = "HEAD"
    (tmp_path / "b.json").write_text(json.dumps(payload))
    with pytest.raises(KfbotError, match=r"pull_request\.head\.sha: expected a 40-character"):
        load_event("pull_request", tmp_path / "b.json", REPO)
    (tmp_path / "c.json").write_text("[]")
    with pytest.raises(KfbotError, match=r"c\.json: not a valid event payload: expected a "
                                         r"JSON object"):
        load_event("schedule", tmp_path / "c.json", REPO)
    with pytest.raises(KfbotError, match=r"event 'push' .* is not handled"):
        load_event("push", tmp_path / "c.json", REPO)


# ---- answering comments end to end ------------------------------------------------------------


def test_scan_answers_with_the_kernel_table(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 0
    (body,) = harness.comments()
    assert body.startswith("<!-- kfbot:status pr=1 command=scan -->\n**🚀 kfbot: 3 CUDA "
                           "kernels found**")
    assert f"`/kfbot scan` from @alice at `{harness.head_sha[:7]}`" in body
    assert "✓ @alice has `write` permission (`write` needed)" in body
    for kernel in ("softmax_kernel", "matmul_kernel", "saxpy_kernel"):
        assert f"| {kernel} |" in body
    # The checkout's own version: the pull request moved softmax_kernel down a line.
    assert "`csrc/softmax.cu:9`" in body
    comment_id = harness.server.comments_on(REPO, 1)[0]["id"]
    assert harness.reactions(comment_id) == ["eyes", "rocket"]
    assert run.summary.startswith("## kfbot: 3 CUDA kernels found\n")
    assert run.outputs["pr-operation"] == "none"


def test_reactions_come_first_and_the_status_comment_is_edited_not_repeated(
        harness: Harness) -> None:
    harness.open_pull()
    harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    calls = harness.server.endpoints()
    reactions = [i for i, c in enumerate(calls) if c.endswith("/reactions")]
    permission = calls.index(f"GET /repos/{REPO}/collaborators/alice/permission")
    assert reactions[0] < permission  # 👀 on receipt, before anything else is decided
    assert calls.count(f"POST /repos/{REPO}/issues/1/comments") == 1
    assert calls.count(f"PATCH /repos/{REPO}/issues/comments/"
                       f"{harness.server.comments_on(REPO, 1)[-1]['id']}") == 1
    harness.server.clear_calls()
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 0
    assert len(harness.comments()) == 1  # the same status comment, edited
    assert f"POST /repos/{REPO}/issues/1/comments" not in harness.server.endpoints()


def test_help_replies_with_the_usage(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("issue_comment", harness.comment_event("/kfbot help"))
    assert run.code == 0
    (body,) = harness.comments()
    assert "command=help" in body and USAGE.strip() in body
    assert "/kfbot optimize <kernel> [budget=N] [time=30m] [islands=N]" in run.summary


@pytest.mark.parametrize(("permission", "shown"), [("read", "read"), ("triage", "triage"),
                                                   (None, "none")])
def test_commenters_without_write_permission_are_refused(harness: Harness,
                                                         permission: str | None,
                                                         shown: str) -> None:
    harness.open_pull()
    if permission is not None:
        harness.server.set_permission(REPO, "bob", permission)
    # The payload says OWNER: kfbot must not trust author_association.
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan", user="bob"))
    assert run.code == 0
    (body,) = harness.comments()
    assert "😕 kfbot: refused: @bob is not authorized: `/kfbot` commands need `write` " \
           f"permission on the repository, and @bob has `{shown}`" in body
    comment = harness.server.comments_on(REPO, 1)[0]["id"]
    assert harness.reactions(comment) == ["eyes", "confused"]
    assert f"GET /repos/{REPO}/pulls/1" not in harness.server.endpoints()  # nothing ran


def test_the_least_permission_comes_from_the_default_branch_config(harness: Harness) -> None:
    harness.push_to_main({"kfbot.yaml": "version: 1\ngithub:\n  min_permission: triage\n"})
    harness.open_pull()
    harness.server.set_permission(REPO, "tim", "triage")
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan", user="tim"))
    assert run.code == 0
    assert "✓ @tim has `triage` permission (`triage` needed)" in harness.comments()[0]


def test_a_pull_request_cannot_lower_the_bar_for_itself(harness: Harness) -> None:
    harness.open_pull({"kfbot.yaml": "version: 1\ngithub:\n  min_permission: read\n"
                                     "  allow_forks: true\n"})
    harness.server.set_permission(REPO, "bob", "read")
    harness.run("issue_comment", harness.comment_event("/kfbot scan", user="bob"))
    assert "@bob is not authorized" in harness.comments()[0]


def test_unknown_kernel_is_answered_with_close_matches(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("issue_comment", harness.comment_event("/kfbot optimize softmax_kernal"))
    assert run.code == 2
    (body,) = harness.comments()
    assert "command=optimize:softmax_kernal" in body
    assert "😕 kfbot: could not run: unknown kernel 'softmax_kernal'; close matches: " \
           "softmax_kernel" in body
    assert harness.reactions(harness.server.comments_on(REPO, 1)[0]["id"])[-1] == "confused"


def test_bad_argument_is_answered_with_the_usage(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("issue_comment",
                      harness.comment_event("/kfbot optimize softmax_kernel budget=lots"))
    assert run.code == 2
    (body,) = harness.comments()
    assert "command=usage" in body
    assert "could not run: `budget=lots`: expected a whole number from 1 to 5000" in body
    assert USAGE.strip() in body


def test_optimize_without_a_gpu_goes_all_the_way_to_the_gpu_step(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("issue_comment",
                      harness.comment_event("/kfbot optimize softmax_kernel budget=8"))
    assert run.code == 3
    (body,) = harness.comments()
    assert "command=optimize:softmax_kernel" in body
    assert "✓ @alice has `write` permission" in body
    assert f"✓ running on the pull request's head `{harness.head_sha[:7]}`" in body
    assert "😕 kfbot: could not run: no CUDA GPU: torch" in body
    assert "`/kfbot optimize` needs a CUDA GPU" in body
    comment = harness.server.comments_on(REPO, 1)[0]["id"]
    assert harness.reactions(comment) == ["eyes", "confused"]
    calls = harness.server.endpoints()
    assert f"GET /repos/{REPO}/pulls/1" in calls  # the head was pinned
    assert calls.count(f"POST /repos/{REPO}/issues/1/comments") == 1  # "running" first ...
    assert any(c.startswith("PATCH") for c in calls)  # ... then edited with the result
    assert "no CUDA GPU" in run.summary and run.outputs["pr-url"] == ""


def test_a_head_that_moved_before_the_run_is_not_used(harness: Harness) -> None:
    harness.open_pull()
    moved = harness.push_to_pull({"csrc/extra.cu": "// pushed after the workflow started\n"})
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 1
    (body,) = harness.comments()
    assert f"the checkout is at {harness.head_sha[:7]}, not at the head of pull request #1 " \
           f"({moved[:7]})" in body
    assert "| softmax_kernel |" not in body


def test_a_sha_that_is_not_the_head_is_refused(harness: Harness) -> None:
    harness.open_pull()
    stale = harness.base_sha
    run = harness.run("issue_comment", harness.comment_event(f"/kfbot scan sha={stale}"))
    assert run.code == 1
    assert f"the command names commit {stale[:7]}, but the head of pull request #1 is " \
           f"{harness.head_sha[:7]}" in harness.comments()[0]


def test_check_head_reads_the_pull_request_again(harness: Harness) -> None:
    harness.open_pull()
    repo = repository(connect(harness.server.token, harness.server.base_url, read_interval=0,
                              write_interval=0), REPO)
    pinned = pin_head(repo, 1, GithubConfig(), None)
    check_head(repo, pinned)  # still there
    moved = harness.push_to_pull({"csrc/extra.cu": "// a push during the search\n"})
    with pytest.raises(HeadMoved, match=f"moved from {harness.head_sha[:7]} to {moved[:7]} "
                                        "after the command was authorized; nothing was "
                                        "published"):
        check_head(repo, pinned)


def _fork_pull(harness: Harness) -> None:
    harness.open_pull()
    harness.server.add_repo("mallory/kernels-demo", fork=True, parent=REPO)
    harness.server.link_remote("mallory/kernels-demo", harness.bare)
    harness.server.pulls[REPO][1]["head_repo"] = "mallory/kernels-demo"


def test_pull_requests_from_forks_are_refused_by_default(harness: Harness) -> None:
    _fork_pull(harness)
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 0
    (body,) = harness.comments()
    assert "refused: pull request #1 comes from a fork (mallory/kernels-demo); kfbot does " \
           "not run code from forks unless the config sets `github.allow_forks: true`" in body
    assert "| softmax_kernel |" not in body


def test_allowed_forks_run_only_the_commit_the_command_names(harness: Harness) -> None:
    harness.push_to_main({".github/kfbot.yaml": "version: 1\ngithub:\n  allow_forks: true\n"})
    _fork_pull(harness)
    harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert f"name the exact commit to run, `sha={harness.head_sha}`" in harness.comments()[0]
    run = harness.run("issue_comment",
                      harness.comment_event(f"/kfbot scan sha={harness.head_sha}"))
    assert run.code == 0
    assert "| softmax_kernel |" in harness.comments()[0]


def test_a_deleted_head_branch_is_reported_and_nothing_runs(harness: Harness) -> None:
    harness.open_pull()
    harness.origin.git.push("origin", "--delete", "softmax-tweak")
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 1
    assert "pull request #1 is closed (or its head branch was deleted); nothing was run" in \
        harness.comments()[0]
    assert "nothing was run" in run.summary
    assert Path(run.outputs["report-path"]).read_text().startswith("## kfbot: could not run")


def test_a_rate_limit_with_retry_after_is_waited_out(harness: Harness) -> None:
    harness.open_pull()
    harness.server.fail_next("GET", f"/repos/{REPO}/collaborators/alice/permission", 403,
                             body={"message": "You have exceeded a secondary rate limit."},
                             headers={"Retry-After": "1"})
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 0
    assert harness.server.endpoints().count(
        f"GET /repos/{REPO}/collaborators/alice/permission") == 2
    assert "| softmax_kernel |" in harness.comments()[0]


def test_a_long_rate_limit_fails_clearly_and_keeps_the_report(harness: Harness) -> None:
    harness.open_pull()
    harness.server.fail_next("GET", f"/repos/{REPO}/collaborators/alice/permission", 429,
                             body={"message": "API rate limit exceeded"},
                             headers={"Retry-After": "3600"}, times=1)
    harness.server.fail_next("POST", f"/repos/{REPO}/issues/1/comments", 429,
                             body={"message": "API rate limit exceeded"},
                             headers={"Retry-After": "3600"}, times=1)
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    assert run.code == 1
    message = "GitHub asks to wait 3600 s (429: API rate limit exceeded; Retry-After 3600), " \
              "longer than the 120 s kfbot waits; try again later"
    first = f"reading @alice's permission: {message}"
    posted = ("the result could not be posted on the pull request: commenting on pull "
              f"request #1: {message}")
    assert first in run.summary and posted in run.summary
    assert f"::error title=kfbot::{posted}" in run.out
    assert message in Path(run.outputs["report-path"]).read_text()


@pytest.mark.parametrize(("fixture", "why"), [
    ("issue_comment.edited.json", "the comment was edited, not created"),
    ("issue_comment.created.by_bot.json", "the comment is from a bot"),
])
def test_ignored_comments_make_no_request_and_need_no_token(harness: Harness, fixture: str,
                                                            why: str) -> None:
    harness.open_pull()
    harness.server.clear_calls()
    run = harness.run("issue_comment", EVENTS / fixture, drop=("INPUT_TOKEN",))
    assert run.code == 0
    assert f"nothing to do: {why}" in run.out
    assert harness.server.calls == []


def test_comments_that_are_not_commands_are_ignored(harness: Harness) -> None:
    harness.open_pull()
    harness.server.clear_calls()
    run = harness.run("issue_comment", harness.comment_event("LGTM, but /kfbot scan later?"))
    assert run.code == 0 and "not a /kfbot command" in run.out
    assert harness.server.calls == []


def test_read_head_of_a_closed_pull_request(harness: Harness) -> None:
    harness.open_pull()
    harness.server.pulls[REPO][1]["state"] = "closed"
    repo = repository(connect(harness.server.token, harness.server.base_url, read_interval=0,
                              write_interval=0), REPO)
    with pytest.raises(HeadMoved, match="pull request #1 is closed"):
        read_head(repo, 1)


# ---- the authorize job, then the GPU job ---------------------------------------------------


def test_the_authorize_job_pins_the_head_without_a_checkout(harness: Harness) -> None:
    harness.open_pull()
    event = harness.comment_event("/kfbot scan")
    empty = harness.tmp / "no-checkout"
    empty.mkdir()
    harness.workspace = empty  # the authorize job checks nothing out
    run = harness.run("issue_comment", event, command="authorize")
    assert run.code == 0
    assert run.outputs["authorized"] == "true"
    assert run.outputs["head-sha"] == harness.head_sha
    (body,) = harness.comments()
    assert "⏳ kfbot: authorized: scan on" in body and "waiting for the GPU runner" in body
    comment = harness.server.comments_on(REPO, 1)[0]["id"]
    assert harness.reactions(comment) == ["eyes"]  # the GPU job ends it


def test_the_gpu_job_runs_the_authorized_head_and_ends_the_status(harness: Harness) -> None:
    harness.open_pull()
    event = harness.comment_event("/kfbot scan")
    run = harness.run("issue_comment", event, head_sha=harness.head_sha)
    assert run.code == 0 and "3 CUDA kernels found" in run.summary
    (body,) = harness.comments()  # the authorize job's comment would be this one, edited
    assert "🚀 kfbot: 3 CUDA kernels found" in body


def test_the_gpu_job_refuses_a_head_that_moved_after_authorization(harness: Harness) -> None:
    harness.open_pull()
    approved = harness.head_sha
    harness.push_to_pull({"csrc/extra.cu": "// pushed after the authorization\n"})
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"), head_sha=approved)
    assert run.code == 1
    assert f"moved from {approved[:7]}" in harness.comments()[0]
    assert "| softmax_kernel |" not in harness.comments()[0]


@pytest.mark.parametrize(("body", "user", "said"), [
    ("/kfbot help", "alice", "kfbot commands"),
    ("/kfbot scan", "mallory", "@mallory is not authorized"),
    ("/kfbot frobnicate\x1b[2J", "alice", "unknown command `frobnicate\\x1b[2J`"),
])
def test_the_authorize_job_answers_what_needs_no_gpu(harness: Harness, body: str, user: str,
                                                     said: str) -> None:
    harness.open_pull()
    run = harness.run("issue_comment", harness.comment_event(body, user=user),
                      command="authorize")
    assert run.outputs["authorized"] == "false" and run.outputs["head-sha"] == ""
    assert said in harness.comments()[0]
    assert "\x1b" not in harness.comments()[0] and "\x1b" not in run.summary


def test_echoed_words_are_cut_and_escaped(harness: Harness) -> None:
    harness.open_pull()
    word = "x" * 2_000_000
    harness.run("issue_comment", harness.comment_event(f"/kfbot {word}"))
    body = harness.comments()[0]
    assert len(body) < 10_000
    assert "unknown command `" + "x" * 79 + "…`" in body


class _PublishedWork:
    """Work whose optimize opened a pull request (the GPU part is not what is tested)."""

    def scan(self) -> Result:
        raise AssertionError("not asked")

    def bench(self, command: Command) -> Result:
        raise AssertionError("not asked")

    def optimize(self, command: Command, policy: GithubConfig, head: Head,
                 before_publish: Callable[[], None], progress: Callable[[str], None]
                 ) -> Result:
        before_publish()
        return Result("softmax_kernel: 3.10x; opened pull request #9", "## the report\n",
                      pr_url="https://github.com/o/r/pull/9", pr_number=9,
                      pr_operation="created", best_speedup=3.1)


def test_a_502_on_the_last_status_update_keeps_the_result(harness: Harness) -> None:
    harness.open_pull()
    event = load_event("issue_comment", harness.comment_event("/kfbot optimize softmax_kernel"),
                       REPO)
    assert isinstance(event, CommentEvent)
    repo = repository(connect(harness.server.token, harness.server.base_url), REPO)
    settings = Settings(harness.workspace, GithubConfig, str, None,
                        Retry(attempts=2, sleep=lambda _: None))
    # Let the 👀 and the first status through; every later edit of the status fails.
    harness.server.fail_next("PATCH", r"/repos/.*/issues/comments/\d+", 502, times=10)
    result = handle_comment(event, repo, _PublishedWork(), settings)
    assert result.pr_url == "https://github.com/o/r/pull/9" and result.best_speedup == 3.1
    assert result.exit_code == 1
    assert "## the report" in result.details
    assert "could not be posted on the pull request" in result.details
    assert any("502" in a.message for a in result.annotations)
    outputs = result.outputs("/tmp/report.md")
    assert outputs["pr-url"] == "https://github.com/o/r/pull/9"
    assert outputs["best-speedup"] == "3.100"


class _SearchingWork(_PublishedWork):
    """Work whose search reports its progress twice before it publishes."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.seen: list[str] = []

    def optimize(self, command: Command, policy: GithubConfig, head: Head,
                 before_publish: Callable[[], None], progress: Callable[[str], None]
                 ) -> Result:
        for line in ("3/64 evaluations, best so far 1.400x (island 0, params), 3m10s elapsed",
                     "9/64 evaluations, best so far 2.100x (island 2, rules), 6m20s elapsed"):
            progress(line)
            self.seen.append(self.harness.comments()[-1])
        return super().optimize(command, policy, head, before_publish, progress)


def _optimize_comment(harness: Harness, work: _PublishedWork) -> Result:
    event = load_event("issue_comment", harness.comment_event("/kfbot optimize softmax_kernel"),
                       REPO)
    assert isinstance(event, CommentEvent)
    repo = repository(connect(harness.server.token, harness.server.base_url), REPO)
    settings = Settings(harness.workspace, GithubConfig, str, None,
                        Retry(attempts=1, sleep=lambda _: None))
    return handle_comment(event, repo, work, settings)


def test_the_status_comment_shows_the_search_as_it_goes(harness: Harness) -> None:
    harness.open_pull()
    work = _SearchingWork(harness)
    result = _optimize_comment(harness, work)
    assert result.exit_code == 0
    assert "kfbot: searching: 3/64 evaluations, best so far 1.400x" in work.seen[0]
    assert "kfbot: searching: 9/64 evaluations, best so far 2.100x (island 2, rules)" \
        in work.seen[1]
    (final,) = harness.comments()
    assert "softmax_kernel: 3.10x; opened pull request #9" in final
    assert "searching:" not in final


def test_a_failed_progress_update_does_not_stop_the_search(harness: Harness) -> None:
    harness.open_pull()
    work = _SearchingWork(harness)
    harness.server.fail_next("PATCH", r"/repos/.*/issues/comments/\d+", 502, times=2)
    result = _optimize_comment(harness, work)
    assert result.exit_code == 0 and result.pr_number == 9
    assert "softmax_kernel: 3.10x; opened pull request #9" in harness.comments()[-1]
