"""`kfbot action` as the composite action runs it: a simulated runner environment.

Each test builds a real git remote (a bare repository made from fixtures/example, with
a pull request branch), a checkout of it as `actions/checkout` would leave it, the fake
GitHub server linked to that remote, an event file from tests/data/events, and the
GITHUB_* / INPUT_* variables; then runs `kfbot.cli.main(["action"])` and reads what a
runner would: stdout/stderr, $GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY and the server.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git
import pytest
from fake_github import FakeGitHub

from kfbot.cli import main
from kfbot.errors import KfbotError
from kfbot.github import action_io
from kfbot.github.action_io import Annotation, fit_summary, output_lines, read_inputs
from kfbot.github.redaction import Redactor

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example"
EVENTS = ROOT / "tests" / "data" / "events"
REPO = "octo-org/kernels-demo"
ANTHROPIC_KEY = "sk-ant-api03-test-Zq8vW2xKpL9mN4rT6yU1iO3aS5dF7gH0jK2lM4nB6vC8xZ"
ACTOR = git.Actor("Alice", "alice@example.com")


# ---- the harness (also used by test_comment_commands.py) ----------------------------------


def commit_files(repo: git.Repo, files: dict[str, str | None], message: str) -> str:
    """Write (or, for None, delete) files in the repo's working tree and commit them."""
    top = Path(repo.working_tree_dir or "")
    for rel, text in files.items():
        path = top / rel
        if text is None:
            repo.index.remove([rel], working_tree=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        repo.index.add([rel])
    return str(repo.index.commit(message, author=ACTOR, committer=ACTOR).hexsha)


@functools.cache
def _template() -> tuple[Path, str]:
    """The example as a remote with one commit on main, a working clone that pushes to it
    and a checkout of main: built once, copied by each test (git is slow to start)."""
    root = Path(tempfile.mkdtemp(prefix="kfbot-test-action-"))
    atexit.register(shutil.rmtree, root, True)
    src = root / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__"))
    origin = git.Repo.init(src, initial_branch="main")
    origin.git.add(A=True)
    base_sha = str(origin.index.commit("the example", author=ACTOR, committer=ACTOR).hexsha)
    git.Repo.init(root / "remote.git", bare=True, initial_branch="main")
    origin.create_remote("origin", str(root / "remote.git"))
    origin.git.push("origin", "main")
    clone = git.Repo.clone_from(str(root / "remote.git"), root / "workspace")
    clone.git.checkout("--detach", base_sha)
    return root, base_sha


@dataclass
class Run:
    code: int
    out: str
    err: str
    outputs: dict[str, str]
    summary: str


@dataclass
class Harness:
    """A remote with `main` and a pull request branch, and the checkout of its head."""

    server: FakeGitHub
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture[str]
    origin: git.Repo = field(init=False)  # a working clone that pushes to the remote
    bare: Path = field(init=False)
    workspace: Path = field(init=False)
    pr: dict[str, Any] = field(default_factory=dict)
    base_sha: str = ""
    head_sha: str = ""

    def __post_init__(self) -> None:
        template, self.base_sha = _template()
        for name in ("src", "remote.git", "workspace"):
            shutil.copytree(template / name, self.tmp / name, symlinks=True)
        self.bare, self.workspace = self.tmp / "remote.git", self.tmp / "workspace"
        self.origin = git.Repo(self.tmp / "src")
        self.origin.remote("origin").set_url(str(self.bare))
        git.Repo(self.workspace).remote("origin").set_url(str(self.bare))
        self.server.add_repo(REPO, default_branch="main")
        self.server.link_remote(REPO, self.bare)
        self.server.set_permission(REPO, "alice", "write")

    # -- the pull request --------------------------------------------------------------

    def open_pull(self, files: dict[str, str | None] | None = None,
                  branch: str = "softmax-tweak") -> dict[str, Any]:
        """Push `branch` with `files` changed and open a pull request from it."""
        self.origin.git.checkout("-b", branch, "main")
        change = files or {"csrc/softmax.cu": _softmax_tweak()}
        self.head_sha = commit_files(self.origin, change, "softmax: a comment")
        self.origin.git.push("origin", branch)
        self.origin.git.checkout("main")
        self.pr = self.server.add_pull(REPO, head=branch, base="main", user="alice")
        self.checkout(self.head_sha)
        return self.pr

    def push_to_pull(self, files: dict[str, str | None], branch: str = "softmax-tweak") -> str:
        self.origin.git.checkout(branch)
        sha = commit_files(self.origin, files, "another change")
        self.origin.git.push("origin", branch)
        self.origin.git.checkout("main")
        return sha

    def push_to_main(self, files: dict[str, str | None]) -> str:
        sha = commit_files(self.origin, files, "on main")
        self.origin.git.push("origin", "main")
        return sha

    def checkout(self, sha: str) -> None:
        """The workspace as actions/checkout leaves it: a full clone, detached at `sha`."""
        clone = git.Repo(self.workspace)
        clone.git.fetch("origin", "+refs/heads/*:refs/remotes/origin/*")
        clone.git.checkout("--detach", sha)

    # -- events and runs -----------------------------------------------------------------

    def comment_event(self, body: str, user: str = "alice", fixture: str =
                      "issue_comment.created.json", number: int | None = None) -> Path:
        payload = json.loads((EVENTS / fixture).read_text())
        number = number if number is not None else self.pr["number"]
        comment = self.server.add_comment(REPO, number, body, user=user)
        payload["issue"]["number"] = number
        payload["comment"].update(id=comment["id"], body=body)
        payload["comment"]["user"]["login"] = user
        return self.write_event(payload)

    def pull_request_event(self, fixture: str = "pull_request.synchronize.json") -> Path:
        payload = json.loads((EVENTS / fixture).read_text())
        pr = payload["pull_request"]
        payload["number"] = pr["number"] = self.pr["number"]
        pr["head"]["sha"], pr["base"]["sha"] = self.head_sha, self.base_sha
        pr["head"]["ref"] = self.pr["head_ref"]
        return self.write_event(payload)

    def write_event(self, payload: dict[str, Any]) -> Path:
        path = self.tmp / "event.json"
        path.write_text(json.dumps(payload))
        return path

    def env(self, event_name: str, event: Path, **inputs: str) -> dict[str, str]:
        runner = self.tmp / "runner"
        runner.mkdir(exist_ok=True)
        env = {"GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": str(event),
               "GITHUB_REPOSITORY": REPO, "GITHUB_WORKSPACE": str(self.workspace),
               "GITHUB_API_URL": self.server.base_url, "GITHUB_SERVER_URL": "https://github.com",
               "GITHUB_RUN_ID": "4242", "GITHUB_ACTIONS": "true",
               "GITHUB_OUTPUT": str(runner / "output"),
               "GITHUB_STEP_SUMMARY": str(runner / "summary.md"), "RUNNER_TEMP": str(runner),
               "KFBOT_GITHUB_INTERVALS": "0,0", "KFBOT_CACHE": str(self.tmp / "cache"),
               "INPUT_TOKEN": self.server.token, "INPUT_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
               # A runner without a GPU, whatever this machine has (the GPU test drops it).
               "CUDA_VISIBLE_DEVICES": ""}
        env.update({action_io.env_name(k.replace("_", "-")): v for k, v in inputs.items()})
        return env

    def run(self, event_name: str, event: Path, drop: tuple[str, ...] = (),
            extra: dict[str, str] | None = None, **inputs: str) -> Run:
        env = {**self.env(event_name, event, **inputs), **(extra or {})}
        for name in list(os.environ):
            if name.startswith(("INPUT_", "GITHUB_")) or name in ("GH_TOKEN",
                                                                  "ANTHROPIC_API_KEY"):
                self.monkeypatch.delenv(name)
        for name, value in env.items():
            if name not in drop:
                self.monkeypatch.setenv(name, value)
        self.capsys.readouterr()
        code = main(["action"])
        out, err = self.capsys.readouterr()
        runner = self.tmp / "runner"
        outputs = parse_outputs((runner / "output").read_text()) \
            if (runner / "output").exists() else {}
        summary_path = runner / "summary.md"
        summary = summary_path.read_text() if summary_path.exists() else ""
        return Run(code, out, err, outputs, summary)

    def comments(self) -> list[str]:
        return [c["body"] for c in self.server.comments_on(REPO, self.pr["number"])
                if c["user"] == self.server.login]

    def reactions(self, comment_id: int) -> list[str]:
        return [r["content"] for r in self.server.reactions.get(comment_id, [])]


def _softmax_tweak() -> str:
    text = (EXAMPLE / "csrc" / "softmax.cu").read_text()
    return "// one more comment: the kernel is unchanged\n" + text


def parse_outputs(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT's `name<<DELIMITER` ... `DELIMITER` blocks, as the runner reads them."""
    outputs, lines = {}, text.split("\n")
    i = 0
    while i < len(lines):
        if "<<" in lines[i]:
            name, delimiter = lines[i].split("<<", 1)
            end = lines.index(delimiter, i + 1)
            outputs[name] = "\n".join(lines[i + 1:end])
            i = end + 1
        else:
            i += 1
    return outputs


def started_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> Iterator[Harness]:
    """The `harness` fixture's body; test_comment_commands.py makes its own from it."""
    monkeypatch.chdir(tmp_path)
    with FakeGitHub() as server:
        yield Harness(server, tmp_path, monkeypatch, capsys)


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Iterator[Harness]:
    yield from started_harness(tmp_path, monkeypatch, capsys)


# ---- inputs ---------------------------------------------------------------------------------


def test_inputs_are_read_and_converted() -> None:
    inputs = read_inputs({"INPUT_COMMAND": "optimize", "INPUT_KERNEL": "softmax_kernel",
                          "INPUT_BUDGET": "12", "INPUT_TIME": "1h30m", "INPUT_ISLANDS": "2",
                          "INPUT_CONFIG": ".github/kfbot.yaml", "INPUT_DRY_RUN": "TRUE",
                          "INPUT_MIN_SPEEDUP": "1.1", "INPUT_GPU": "1", "INPUT_TOKEN": " t ",
                          "INPUT_ANTHROPIC_API_KEY": ""})
    assert (inputs.command, inputs.kernel, inputs.budget, inputs.time, inputs.islands) == \
        ("optimize", "softmax_kernel", 12, 5400.0, 2)
    assert (inputs.config, inputs.dry_run, inputs.min_speedup, inputs.gpu, inputs.token) == \
        (".github/kfbot.yaml", True, 1.1, 1, "t")
    defaults = read_inputs({})
    assert (defaults.command, defaults.budget, defaults.islands, defaults.dry_run) == \
        ("auto", 64, 4, False)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("INPUT_BUDGET", "lots", "action input 'budget' (INPUT_BUDGET): expected a positive "
                             "integer, got 'lots'"),
    ("INPUT_ISLANDS", "0", "action input 'islands' (INPUT_ISLANDS): expected a positive"),
    ("INPUT_TIME", "soon", "action input 'time' (INPUT_TIME): not a duration: 'soon'"),
    ("INPUT_DRY_RUN", "yes", "action input 'dry-run' (INPUT_DRY_RUN): expected true or false"),
    ("INPUT_MIN_SPEEDUP", "0.9", "action input 'min-speedup' (INPUT_MIN_SPEEDUP): expected a "
                                 "speedup of at least 1.0"),
    ("INPUT_MIN_SPEEDUP", "fast", "expected a number such as 1.05, got 'fast'"),
    ("INPUT_COMMAND", "deploy", "action input 'command' (INPUT_COMMAND): expected one of "
                                "auto, optimize, scan, guard, authorize, publish, got 'deploy'"),
    ("INPUT_CONFIG", "../secrets.yaml", "action input 'config' (INPUT_CONFIG): expected a "
                                        "path inside the repository"),
    ("INPUT_GPU", "-1", "action input 'gpu' (INPUT_GPU): expected a GPU index"),
    ("INPUT_KERNEL", "a b", "action input 'kernel' (INPUT_KERNEL): expected one kernel name"),
    ("INPUT_ARTIFACT", "kfbot-run", "action input 'artifact' (INPUT_ARTIFACT): expected an "
                                   "absolute path"),
])
def test_bad_inputs_name_the_input(name: str, value: str, message: str) -> None:
    with pytest.raises(KfbotError) as caught:
        read_inputs({name: value})
    assert message in str(caught.value)


def test_a_bad_input_fails_the_run_with_a_summary(harness: Harness) -> None:
    run = harness.run("schedule", EVENTS / "schedule.json", budget="lots")
    assert run.code == 2
    assert "kfbot: error: action input 'budget' (INPUT_BUDGET): expected a positive integer" \
        in run.err
    assert run.summary.startswith("## kfbot: error: action input 'budget'")
    assert "::error title=kfbot::action input 'budget'" in run.out
    assert run.outputs["report-path"].endswith("kfbot-report.md")


# ---- workflow commands and files ---------------------------------------------------------------


def test_annotations_escape_data_and_properties() -> None:
    note = Annotation("error", "100% wrong\r\nsecond line", "csrc/a,b:c.cu", 12, "kfbot: scan")
    assert note.command() == ("::error file=csrc/a%2Cb%3Ac.cu,line=12,title=kfbot%3A scan::"
                              "100%25 wrong%0D%0Asecond line")
    assert Annotation("warning", "plain").command() == "::warning::plain"


def test_outputs_survive_multiline_values_and_fake_delimiters() -> None:
    values = {"pr-url": "https://github.com/o/r/pull/3", "report-path": "a\nb\nEOF\n",
              "best-speedup": ""}
    text = output_lines(values)
    assert parse_outputs(text) == {k: v for k, v in values.items()}
    assert text.count("ghadelimiter_") == 6


def test_summary_is_cut_under_a_mebibyte_with_a_note() -> None:
    long = "## kfbot: verdict\n\n" + "| row | ✓ µs |\n" * 120_000
    cut = fit_summary(long, "/tmp/kfbot/kfbot-report.md")
    assert len(cut.encode()) < 1024 * 1024
    assert cut.startswith("## kfbot: verdict\n")
    assert cut.endswith("bytes left out; the full report is `/tmp/kfbot/kfbot-report.md`.\n")
    assert "| row | ✓ µs |\n\n> **Summary truncated**" in cut  # cut at a line end
    assert fit_summary("short\n", None) == "short\n"


def test_redactor_hides_secrets_and_their_basic_auth_form() -> None:
    redact = Redactor(["ghs_abcdefgh", "", "xy"])
    import base64

    wire = base64.b64encode(b"x-access-token:ghs_abcdefgh").decode()
    assert redact(f"token ghs_abcdefgh; header {wire}; xy") == "token ***; header ***; xy"
    assert "::add-mask::ghs_abcdefgh" in redact.mask_commands()


# ---- secrets ----------------------------------------------------------------------------------


def _everything_written(harness: Harness, run: Run) -> dict[str, str]:
    """Each thing a runner or a reader could see, by where it is."""
    seen = {"stdout": "\n".join(line for line in run.out.splitlines()
                                if not line.startswith("::add-mask::")),
            "stderr": run.err, "summary": run.summary, "outputs": json.dumps(run.outputs),
            "github": json.dumps([c.json for c in harness.server.calls])}
    for folder in (harness.tmp / "runner", harness.workspace):
        for path in folder.rglob("*"):
            if path.is_file() and ".git" not in path.parts:
                seen[str(path)] = path.read_text(errors="replace")
    return seen


@pytest.mark.parametrize("kernel_input", ["", ANTHROPIC_KEY])
def test_secrets_reach_no_log_report_output_or_comment(harness: Harness,
                                                       kernel_input: str) -> None:
    harness.open_pull()
    # The second case pastes the key where a kernel name goes: the error quotes the
    # input, and the key must still not come out.
    command = "/kfbot scan" if not kernel_input else f"/kfbot bench {kernel_input}"
    run = harness.run("issue_comment", harness.comment_event(command))
    masks = [line for line in run.out.splitlines() if line.startswith("::add-mask::")]
    assert f"::add-mask::{harness.server.token}" in masks
    assert f"::add-mask::{ANTHROPIC_KEY}" in masks
    for where, text in _everything_written(harness, run).items():
        assert harness.server.token not in text, where
        assert ANTHROPIC_KEY not in text, where
    if kernel_input:
        assert "unknown kernel '***'" in harness.comments()[0]
    # Compilers, git and the repository's tests inherit the environment: no token there.
    assert not {"INPUT_TOKEN", "GITHUB_TOKEN", "INPUT_ANTHROPIC_API_KEY"} & set(os.environ)


def test_the_module_entry_point_keeps_secrets_out_of_its_streams(harness: Harness) -> None:
    env = {**os.environ, **harness.env("workflow_dispatch", EVENTS / "workflow_dispatch.json",
                                       command="scan")}
    env["GITHUB_WORKSPACE"] = str(EXAMPLE)
    done = subprocess.run([sys.executable, "-m", "kfbot", "action"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    visible = [line for line in done.stdout.splitlines() if not line.startswith("::add-mask")]
    assert visible == ["kfbot: 3 CUDA kernels found"]
    assert done.stderr == ""
    assert ANTHROPIC_KEY not in done.stderr and harness.server.token not in done.stderr


# ---- the runner's environment -------------------------------------------------------------------


def test_a_missing_token_is_a_clear_error(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"),
                      drop=("INPUT_TOKEN",))
    assert run.code == 2
    assert "no GitHub token: set the action's 'token' input" in run.err
    assert run.summary.startswith("## kfbot: error: no GitHub token")


def test_a_malformed_event_file_is_named(harness: Harness) -> None:
    run = harness.run("issue_comment", EVENTS / "issue_comment.truncated.json")
    assert run.code == 2
    assert f"{EVENTS / 'issue_comment.truncated.json'}: not a valid event payload: invalid " \
           "JSON at line" in run.err
    assert harness.server.calls == []


def test_outside_a_runner_it_says_what_is_missing(harness: Harness) -> None:
    run = harness.run("schedule", EVENTS / "schedule.json", drop=("GITHUB_EVENT_NAME",))
    assert run.code == 2
    assert "GITHUB_EVENT_NAME is not set: `kfbot action` runs inside a GitHub Actions job" \
        in run.err


@pytest.mark.parametrize(("event", "command", "message"), [
    ("push", "auto", "event 'push' (GITHUB_EVENT_NAME) is not handled"),
    ("issue_comment", "scan", "action input 'command': 'scan' does not apply to "
                              "issue_comment events"),
    ("schedule", "guard", "action input 'command': guard needs a pull_request event, "
                          "not schedule"),
])
def test_commands_that_do_not_fit_the_event(harness: Harness, event: str, command: str,
                                            message: str) -> None:
    run = harness.run(event, EVENTS / "issue_comment.created.json", command=command)
    assert run.code == 2 and message in run.err


# ---- schedule and workflow_dispatch -------------------------------------------------------------


def test_dispatch_scan_writes_the_table_to_the_summary(harness: Harness) -> None:
    harness.checkout(harness.base_sha)
    run = harness.run("workflow_dispatch", EVENTS / "workflow_dispatch.json", command="scan")
    assert run.code == 0
    assert run.summary.startswith("## kfbot: 3 CUDA kernels found\n")
    assert "| softmax_kernel | `csrc/softmax.cu:8` |" in run.summary
    assert harness.server.calls == []  # a scan needs no GitHub
    assert run.outputs == {"pr-url": "", "pr-number": "", "pr-operation": "none",
                           "best-speedup": "", "report-path": str(harness.tmp / "runner" /
                                                                  "kfbot" / "kfbot-report.md"),
                           "authorized": "false", "head-sha": ""}


def test_schedule_dry_run_plans_without_a_gpu(harness: Harness) -> None:
    harness.checkout(harness.base_sha)
    run = harness.run("schedule", EVENTS / "schedule.json", kernel="softmax_kernel",
                      dry_run="true", budget="16")
    assert run.code == 0, run.err
    assert run.summary.startswith("## kfbot: dry run: the plan for softmax_kernel\n")
    assert "kernel csrc/softmax.cu::softmax_kernel: 4 islands" in run.summary
    assert "budget 16 evaluations" in run.summary
    assert harness.server.calls == []
    # The job's log folds each kernel's work into a group of its own.
    assert run.out.count("::group::kfbot optimize softmax_kernel\n") == 1
    assert run.out.count("::endgroup::\n") == 1


@pytest.mark.gpu
def test_a_scheduled_search_logs_every_evaluation(harness: Harness) -> None:
    harness.checkout(harness.base_sha)
    run = harness.run("schedule", EVENTS / "schedule.json", kernel="softmax_kernel",
                      budget="4", islands="2", drop=("CUDA_VISIBLE_DEVICES",))
    assert run.code in (0, 1), run.err
    group = run.out.split("::group::kfbot optimize softmax_kernel\n", 1)[1]
    lines = [line for line in group.split("::endgroup::")[0].splitlines()
             if line.startswith("evaluation ")]
    assert [line.split(":")[0] for line in lines] == \
        [f"evaluation {n}/4" for n in range(1, len(lines) + 1)]
    assert lines and all(re.match(r"evaluation \d/4: island [01], \w+: ", line) for line in lines)


def test_schedule_without_a_gpu_fails_clearly(harness: Harness) -> None:
    harness.checkout(harness.base_sha)
    run = harness.run("schedule", EVENTS / "schedule.json")
    assert run.code == 3
    assert run.summary.startswith("## kfbot: error: no CUDA GPU: torch ")
    assert "::error title=kfbot::no CUDA GPU" in run.out


# ---- the pull request guard --------------------------------------------------------------------


def test_guard_without_a_gpu_says_the_gpu_step_did_not_run(harness: Harness) -> None:
    harness.open_pull({"csrc/softmax.cu": _softmax_tweak(),
                       "kernels_demo/broken.py": "import torch\n\ndef f(:\n    pass\n"})
    run = harness.run("pull_request", harness.pull_request_event())
    assert run.code == 3
    (body,) = harness.comments()
    assert body.startswith("<!-- kfbot:status pr=1 command=guard -->\n**😕 kfbot: the GPU "
                           "step could not run: no CUDA GPU: torch")
    assert "**not verified against their reference nor benchmarked**" in body
    assert "| softmax_kernel | `csrc/softmax.cu:9` | csrc/softmax.cu | not verified, not " \
           "benchmarked |" in body
    assert "matmul_kernel" not in body  # unchanged kernels are not listed
    assert "::error title=kfbot guard::the GPU step could not run: no CUDA GPU" in run.out
    assert "::warning file=kernels_demo/broken.py,line=3,title=kfbot scan::Python syntax " \
           "error: invalid syntax" in run.out
    assert run.summary.startswith("## kfbot: the GPU step could not run")


def test_guard_reports_a_lost_reference_test(harness: Harness) -> None:
    tests = (EXAMPLE / "tests" / "test_ops.py").read_text()
    kept = tests[:tests.index("@pytest.mark.parametrize(\"shape\", [(1 << 20,)")]
    harness.open_pull({"tests/test_ops.py": kept})
    run = harness.run("pull_request", harness.pull_request_event(), command="guard")
    assert "::warning file=csrc/vector_add.cu,line=7,title=kfbot guard::csrc/vector_add.cu:7: " \
           "saxpy_kernel: no reference test reaches it any more" in run.out
    assert run.code == 0  # a warning: the test may have moved where kfbot cannot see it
    assert "softmax_kernel: no reference test" not in run.out  # the others are still tested
    (body,) = harness.comments()
    assert "**Reference tests lost:**\n\n- csrc/vector_add.cu:7: saxpy_kernel: no reference " \
           "test reaches it any more (at main: tests/test_ops.py:30 test_saxpy)\n" in body
    assert "0 changed kernels" in body


def test_guard_stays_quiet_when_no_kernel_changed(harness: Harness) -> None:
    harness.open_pull({"README.md": "# the example\n\nNothing to do with kernels.\n"})
    run = harness.run("pull_request", harness.pull_request_event())
    assert run.code == 0
    assert run.summary.startswith("## kfbot: no kernel changed in this pull request")
    assert harness.comments() == []


def test_guard_needs_the_base_commit(harness: Harness) -> None:
    harness.open_pull()
    event = json.loads(harness.pull_request_event().read_text())
    event["pull_request"]["base"]["sha"] = "0123456789abcdef0123456789abcdef01234567"
    run = harness.run("pull_request", harness.write_event(event))
    assert run.code == 2
    assert "the base commit 0123456 of pull request #1 is not in the checkout" in run.err
    assert "fetch-depth: 0" in run.err


@pytest.mark.gpu
def test_guard_on_a_gpu_verifies_and_times_the_change(harness: Harness) -> None:
    harness.open_pull()
    run = harness.run("pull_request", harness.pull_request_event(),
                      drop=("CUDA_VISIBLE_DEVICES",))
    (body,) = harness.comments()
    assert run.code == 0, body
    assert "| softmax_kernel | `csrc/softmax.cu:9` | csrc/softmax.cu | ✓ correct" in body
    assert body.startswith("<!-- kfbot:status pr=1 command=guard -->\n**✅ kfbot: 1 changed "
                           "kernel: verified, none slower than the base**")
