"""The attacks on kfbot's runner, each reproduced for real: a pull request's planted
modules, a child reading its parent's environment, planted git hooks, a push to
somewhere else, links out of the repository, a kernel file that is not UTF-8, and a
failure after the search. None gets a secret; no result is lost."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_github import FakeGitHub
from test_action import ANTHROPIC_KEY, EXAMPLE, REPO, Harness, started_harness
from test_publish import LESSON, _evaluation, _git, _remote_head, _settings, _winner, repos

from kfbot import git
from kfbot.config import Config, load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.candidate_files import load_candidate, patched_paths
from kfbot.evaluate.task import make_task
from kfbot.github.publish import publish
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.branch import commit_detached, write_branch
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.islands import SearchResult
from kfbot.search.model import Cell
from kfbot.search.mutators.rotation import Mutators
from kfbot.search.plan import OptimizeSettings
from kfbot.search.runner import OptimizeOutcome, write_outputs

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
__all__ = ["repos"]  # the fixture, shared with test_publish.py
pytest_plugins = ["fake_github"]

# What a hostile file does when it runs: say where, and what it could see.
SPY = """
import json, os, sys
with open({out!r} + "/" + {name!r}.replace("/", "_"), "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
"""


def spy(out: Path, name: str) -> str:
    return SPY.format(out=str(out), name=name)


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Any:
    yield from started_harness(tmp_path, monkeypatch, capsys)


# ---- the Action never runs the checkout's code ---------------------------------------------


def _render(text: str, values: dict[str, str]) -> str:
    """`${{ ... }}` as the runner renders the few forms action.yml may use."""
    def one(match: re.Match[str]) -> str:
        return values[match.group(1).strip()]
    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def _action_copy(tmp: Path) -> Path:
    """The action as the runner downloads it: the repository's tracked files."""
    dest = tmp / "_actions" / "kfbot"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file() and not source.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    return dest


def run_composite(action: Path, env: dict[str, str], inputs: dict[str, str],
                  runner: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every step of action.yml as the runner runs a composite action's bash steps."""
    spec = yaml.safe_load((action / "action.yml").read_text())
    values = {f"inputs.{k}": v.get("default", "") for k, v in spec["inputs"].items()}
    values.update({f"inputs.{k}": v for k, v in inputs.items()})
    values["github.action_path"] = str(action)
    done: dict[str, subprocess.CompletedProcess[str]] = {}
    for step in spec["runs"]["steps"]:
        output = runner / f"output-{step['id']}"
        output.touch()
        step_env = {**env, "GITHUB_ACTION_PATH": str(action), "GITHUB_OUTPUT": str(output),
                    **{k: _render(str(v), values) for k, v in step.get("env", {}).items()}}
        script = runner / f"step-{step['id']}.sh"
        script.write_text(step["run"])
        cwd = _render(step.get("working-directory", env["GITHUB_WORKSPACE"]), values)
        done[step["id"]] = proc = subprocess.run(
            step_command(step, script), cwd=cwd, env=step_env, capture_output=True, text=True,
            timeout=600)
        assert proc.returncode in (0, 1), proc.stderr[-3000:]
        for line in output.read_text().splitlines():
            if "=" in line and "<<" not in line:
                key, _, value = line.partition("=")
                values[f"steps.{step['id']}.outputs.{key}"] = value
    return done


# How the runner starts a step for each `shell:` keyword (a template with {0} is used as is).
SHELLS = {"bash": "bash --noprofile --norc -eo pipefail {0}", "sh": "sh -e {0}"}


def step_command(step: dict[str, Any], script: Path) -> list[str]:
    """The command line the runner runs a composite step's script with."""
    template = str(step.get("shell", "bash"))
    template = SHELLS.get(template, template)
    return [str(script) if word == "{0}" else word for word in shlex.split(template)]


PLANTED = ("github/__init__.py", "yaml.py", "kfbot/__init__.py", "kfbot/__main__.py",
           "pip/__init__.py", "pip/__main__.py", "rich.py", "venv.py", "sitecustomize.py",
           "torch.py")


@functools.cache
def old_runner_python() -> Path:
    """An interpreter like a stock runner's: setuptools older than 77, which refuses
    kfbot's `license = "Apache-2.0"` if the build ever sees it. Made once."""
    root = Path(tempfile.mkdtemp(prefix="kfbot-old-runner-"))
    atexit.register(shutil.rmtree, root, True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "setuptools<70"], check=True, timeout=600)
    return python


def test_the_action_installs_and_runs_on_a_hostile_runner(harness: Harness) -> None:
    """The real action.yml steps, as a runner runs them, for `/kfbot help` from a commenter
    without permission on a pull request that plants the modules kfbot, pip and their
    imports would load first; the job's environment sets BASH_ENV and exports a shell
    function named like a command the steps use (what an earlier step can do through
    $GITHUB_ENV); and the runner's Python has a setuptools older than kfbot's build needs."""
    seen = harness.tmp / "seen"
    seen.mkdir()
    harness.open_pull({name: spy(seen, name) for name in PLANTED})
    event = harness.comment_event("/kfbot help", user="mallory")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(harness.env("issue_comment", event))
    bash_env = harness.tmp / "bash_env.sh"
    bash_env.write_text(f"touch {seen}/BASH_ENV\n")
    env.update({"PYTHONPATH": str(harness.workspace),  # what a careless job might set
                "RUNNER_TEMP": str(harness.tmp / "runner"), "BASH_ENV": str(bash_env),
                "BASH_FUNC_rm%%": f"() {{ touch {seen}/rm; }}",
                "BASH_FUNC_exec%%": f"() {{ touch {seen}/exec; }}"})
    action = _action_copy(harness.tmp)
    runner = old_runner_python()
    old = subprocess.run([str(runner), "-I", "-c",
                          "import setuptools; print(setuptools.__version__)"],
                         capture_output=True, text=True, check=True).stdout
    assert int(old.split(".")[0]) < 77
    inputs = {"python": str(runner), "token": harness.server.token,
              "anthropic-api-key": ANTHROPIC_KEY}
    steps = run_composite(action, {k: v for k, v in env.items() if not k.startswith("INPUT_")},
                          inputs, harness.tmp / "runner")
    assert steps["install"].returncode == 0, steps["install"].stderr[-3000:]
    assert sorted(os.listdir(seen)) == []  # no planted module, BASH_ENV or function ran
    assert harness.comments(), steps["kfbot"].stdout[-2000:] + steps["kfbot"].stderr[-3000:]
    assert "@mallory is not authorized" in harness.comments()[0]
    assert steps["kfbot"].returncode == 0, steps["kfbot"].stderr[-3000:]
    (pth,) = (harness.tmp / "runner" / "kfbot-venv").glob("lib/python*/site-packages/"
                                                          "_kfbot_runner_site.pth")
    lines = pth.read_text().splitlines()
    assert lines and all(line.startswith("/") and Path(line).is_dir() for line in lines)


def test_the_run_steps_shell_reads_no_bash_env(tmp_path: Path) -> None:
    """The run step's own script under the shell action.yml declares, and under the
    runner's default bash for contrast: only the latter sources BASH_ENV."""
    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    (step,) = [s for s in spec["runs"]["steps"] if s["id"] == "kfbot"]
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    marker = tmp_path / "sourced"
    (tmp_path / "bash_env.sh").write_text(f"touch {marker}\n")
    event = tmp_path / "event.json"
    event.write_text("{}")
    env = {"PATH": os.environ["PATH"], "BASH_ENV": str(tmp_path / "bash_env.sh"),
           "KFBOT_VENV_PYTHON": sys.executable, "GITHUB_EVENT_NAME": "workflow_dispatch",
           "GITHUB_EVENT_PATH": str(event), "GITHUB_REPOSITORY": "octo/kernels",
           "GITHUB_WORKSPACE": str(EXAMPLE), "RUNNER_TEMP": str(tmp_path),
           "INPUT_BUDGET": "lots"}  # kfbot starts, says what is wrong and ends: quick
    declared = subprocess.run(step_command(step, script), env=env, capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    assert declared.returncode == 2, declared.stderr
    assert "action input 'budget'" in declared.stderr and not marker.exists()
    plain = subprocess.run(step_command({"shell": "bash"}, script), env=env,
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert plain.returncode == 2 and marker.exists()


# ---- secrets out of every environment ------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_the_action_process_holds_no_secret_in_its_environment(harness: Harness) -> None:
    harness.open_pull()
    env = {**os.environ, **harness.env("issue_comment", harness.comment_event("/kfbot help")),
           "GH_PAT": "ghp_personal0123456789", "CI_JOB_JWT": "eyJsecretjwt0123"}
    arrived, release = harness.server.hold_next("GET", f"/repos/{REPO}/issues/1")
    proc = subprocess.Popen([sys.executable, "-I", "-m", "kfbot", "action"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert arrived.wait(60), "kfbot never asked for the pull request"
        seen = _environ(proc.pid)
    finally:
        release.set()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    text = json.dumps(seen)
    for secret in (harness.server.token, ANTHROPIC_KEY, "ghp_personal0123456789", "eyJsecret"):
        assert secret not in text
    assert seen["GITHUB_REPOSITORY"] == REPO and "PATH" in seen
    assert "kfbot commands" in harness.comments()[0]  # and it still did its work


ATTACK = """
import json, os, sys
parent = open(f"/proc/{os.getppid()}/environ", "rb").read().decode(errors="replace")
with open(sys.argv[1], "w") as f:
    json.dump({"parent": parent, "own": dict(os.environ)}, f)
"""
DRIVER = """
import subprocess, sys
from kfbot.evaluate.sandbox.credentials import protect
protect()
from kfbot.evaluate.sandbox import untrusted_env
subprocess.run([sys.executable, "-c", {attack!r}, {out!r}], env=untrusted_env(), check=True)
"""


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_untrusted_code_finds_no_secret_in_its_parent(tmp_path: Path) -> None:
    out = tmp_path / "found.json"
    secrets = {"INPUT_TOKEN": "ghs_token0123456789", "INPUT_ANTHROPIC_API_KEY": "sk-ant-0123456",
               "GH_PAT": "ghp_pat0123456789", "PIP_INDEX_URL": "https://u:pw0123456@pypi.x",
               "CI_JOB_JWT": "eyJjwt0123456789", "GIT_CONFIG_VALUE_0": "AUTHORIZATION: basic x"}
    env = {**os.environ, **secrets}
    subprocess.run([sys.executable, "-I", "-c", DRIVER.format(attack=ATTACK, out=str(out))],
                   env=env, check=True, timeout=60)
    found = json.loads(out.read_text())
    text = found["parent"] + json.dumps(found["own"])
    for value in secrets.values():
        assert value not in text
    assert "PATH=" in found["parent"]


# ---- git hooks and where a push goes -------------------------------------------------------

HOOKS = ("pre-push", "post-checkout", "reference-transaction", "pre-commit", "commit-msg",
         "post-commit", "prepare-commit-msg", "post-index-change")


def _plant_hooks(work: Path, seen: Path) -> None:
    hooks = work / ".git" / "hooks"
    for name in HOOKS:
        (hooks / name).write_text(f"#!/bin/sh\nenv > {seen}/{name}\n")
        (hooks / name).chmod(0o755)


def test_planted_hooks_never_run(repos: tuple[Path, Path], fake_github: FakeGitHub,
                                 tmp_path: Path) -> None:
    work, remote = repos
    seen = tmp_path / "seen"
    seen.mkdir()
    _plant_hooks(work, seen)
    result = publish(_winner(work), _settings(fake_github))
    write_branch(work, {"csrc/softmax.cu": "// local\n"}, "kfbot/local", "local winner")
    assert result.operation == "created" and _remote_head(remote, result.branch) == result.sha
    assert sorted(os.listdir(seen)) == []


@pytest.mark.parametrize("rewrite", [
    ("remote", "https://github.com/mallory/kernels.git"),
    ("remote", "https://evil.example/octo/kernels.git"),
    ("insteadOf", "https://evil.example/octo/kernels.git"),
])
def test_the_token_goes_only_to_the_repository_published_to(
        repos: tuple[Path, Path], fake_github: FakeGitHub, rewrite: tuple[str, str]) -> None:
    work, remote = repos
    how, where = rewrite
    if how == "remote":
        _git(work, "remote", "set-url", "origin", where)
    else:
        _git(work, "remote", "set-url", "origin", "https://github.com/octo/kernels.git")
        _git(work, "config", f"url.{where}.insteadOf", "https://github.com/octo/kernels.git")
    with pytest.raises(KfbotError, match="kfbot sends its token only to the repository"):
        publish(_winner(work), _settings(fake_github))
    assert _remote_head(remote, "kfbot/csrc-softmax.cu-softmax_kernel") is None
    assert fake_github.calls == []


def test_a_credential_left_in_git_config_is_reported(repos: tuple[Path, Path],
                                                     fake_github: FakeGitHub) -> None:
    work, _ = repos
    _git(work, "config", "http.https://github.com/.extraheader", "AUTHORIZATION: basic eA==")
    result = publish(_winner(work), _settings(fake_github))
    assert result.operation == "created"
    (warning,) = result.warnings
    assert "http.https://github.com/.extraheader" in warning
    assert "persist-credentials: false" in warning and "eA==" not in warning


# ---- nothing outside the repository is read ------------------------------------------------


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """A copy of the example with links out of it: to a secret, to / and in a loop."""
    root = tmp_path / "repo"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    outside = tmp_path / "outside"
    (outside / "more").mkdir(parents=True)
    (outside / "credentials").write_text("ghp_SECRETSECRETSECRET0123\n")
    (outside / "more" / "k.cu").write_text("__global__ void outside_kernel() {}\n")
    os.symlink(outside / "credentials", root / "csrc" / "stolen.cu")
    os.symlink(outside / "more", root / "csrc" / "more")
    os.symlink("/", root / "everything")
    os.symlink("..", root / "csrc" / "up")
    return root


def test_the_scan_skips_links_that_leave_the_repository(linked: Path) -> None:
    report = scan(linked, Config())
    names = {k.name for k in report.kernels}
    assert "softmax_kernel" in names and "outside_kernel" not in names
    said = {p.file: p.message for p in report.problems}
    for rel in ("csrc/stolen.cu", "csrc/more", "everything"):
        assert "outside the repository; not read" in said[rel]
    assert "symlink loop" in said["csrc/up"]
    assert report.files_scanned < 20  # / was not walked


def test_a_linked_config_is_refused_without_quoting_its_target(linked: Path) -> None:
    os.symlink(linked.parent / "outside" / "credentials", linked / "kfbot.yaml")
    with pytest.raises(KfbotError) as err:
        load_config(None, linked)
    assert "kfbot.yaml: the config file is a symbolic link" in str(err.value)
    assert "SECRET" not in str(err.value) and "outside" not in str(err.value)


def test_a_linked_config_in_a_pull_request_is_refused_on_the_pull_request(
        harness: Harness) -> None:
    secret = harness.tmp / "credentials"
    secret.write_text("ghp_SECRETSECRETSECRET0123\n")
    harness.open_pull({"README.md": "a pull request that links the config\n"})
    os.symlink(secret, harness.workspace / "kfbot.yaml")  # as a checkout of such a link
    run = harness.run("issue_comment", harness.comment_event("/kfbot scan"))
    (body,) = harness.comments()
    assert "the config file is a symbolic link" in body
    assert "SECRET" not in body + run.summary + run.out + run.err


def test_candidate_files_behind_links_out_are_not_read(linked: Path, tmp_path: Path) -> None:
    folder = tmp_path / "candidate"
    (folder / "csrc").mkdir(parents=True)
    (folder / "csrc" / "softmax.cu").write_text("// faster\n")
    os.symlink(linked.parent / "outside" / "credentials", folder / "csrc" / "matmul.cu")
    candidate = load_candidate(folder, linked, ("csrc/softmax.cu", "csrc/matmul.cu"))
    assert dict(candidate.files) == {"csrc/softmax.cu": "// faster\n"}


# ---- kernel files that are not UTF-8 -------------------------------------------------------


def test_a_kernel_file_that_is_not_utf8_is_refused_before_any_gpu_time() -> None:
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "latin1_kernel", "--repo",
                           str(FIXTURES / "hostile")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "latin1.cu:1:6: not valid UTF-8 (byte 0xf6)" in done.stderr
    assert "GPU" not in done.stderr


def test_a_task_of_a_utf8_kernel_with_crlf_lines_keeps_its_bytes(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "load_elementwise", root)
    path = root / "csrc" / "gelu_kernel.cu"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    kernel = select_kernel(scan(root, Config()).kernels, "gelu_kernel")
    mutators = Mutators(make_task(kernel, root, Config()), knobs=(), rewrites=())
    assert mutators.base_files()["csrc/gelu_kernel.cu"].encode() == path.read_bytes()


# ---- results survive a failure after the search --------------------------------------------


def test_a_failing_worktree_keeps_the_report_and_the_patch(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "load_elementwise", root)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=D", "-c", "user.email=d@x",
                                                 "commit", "-qm", "init"]):
        _git(root, *args)
    (root / ".git" / "worktrees").write_text("not a folder: git worktree add fails\n")
    kernel = select_kernel(scan(root, Config()).kernels, "gelu_kernel")
    task = make_task(kernel, root, Config())
    source = (root / "csrc" / "gelu_kernel.cu").read_text()
    cand = Candidate({"csrc/gelu_kernel.cu": source.replace("kBlockSize = 128",
                                                            "kBlockSize = 256")},
                     origin="rules", rationale="bigger blocks")
    best = Individual(cand.hash, None, 0, Cell("global", "none", "thread-per-element", "256"),
                      1.6, "done", "correct", "rules", 1)
    ev = _evaluation(1.6, cand.hash)
    outcome = OptimizeOutcome(SearchResult(best, [], [best]), ev, cand, {"evaluations": 1.0},
                              committed=(ev, cand))
    run_dir = tmp_path / "run"
    files = write_outputs(task, outcome, run_dir, OptimizeSettings(islands=1, seed=1))
    assert "branch" not in files
    assert "kBlockSize = 256" in (run_dir / "best.patch").read_text()
    report = (run_dir / "report.md").read_text()
    assert "## Branch not written" in report and "worktree" in report
    assert json.loads((run_dir / "report.json").read_text())["best"] is not None


# ---- files that are not what their names say -----------------------------------------------


def _repo_with_commit(root: Path) -> Path:
    root.mkdir(parents=True)
    _git(root, "init", "-q")
    (root / "README.md").write_text("kernels\n")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=D", "-c", "user.email=d@x", "commit", "-qm", "init")
    return root


def test_a_fifo_named_like_a_kernel_hangs_neither_scan_nor_check(tmp_path: Path) -> None:
    root = _repo_with_commit(tmp_path / "repo")
    (root / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1; }\n")
    os.mkfifo(root / "fifo.cu")  # nothing ever writes it: a read would wait forever
    scan_run = subprocess.run([sys.executable, "-m", "kfbot", "scan", str(root)],
                              capture_output=True, text=True, timeout=120)
    assert scan_run.returncode == 0, scan_run.stderr
    assert "fifo.cu: not a regular file (a FIFO, socket or device); not read" in scan_run.stdout
    check = subprocess.run([sys.executable, "-m", "kfbot", "check", "fifo.cu", "k.cu"],
                           cwd=root, capture_output=True, text=True, timeout=120)
    assert check.returncode in (0, 1), check.stderr  # 1: no reference test; never a hang
    assert "k.cu" in check.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_kernel_file_named_like_an_nvcc_option_stays_a_file(tmp_path: Path) -> None:
    """`--options-file=o.opts.cu` as an argument makes nvcc read its options from the
    repository: here `-ccbin ./evil`, which runs a program of the repository's."""
    root = _repo_with_commit(tmp_path / "repo")
    ran = root / "EVIL_RAN"
    (root / "evil").write_text(f"#!/bin/sh\necho ran > {ran}\nexit 1\n")
    (root / "evil").chmod(0o755)
    (root / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1; }\n")
    (root / "o.opts.cu").write_text(f"-ccbin {root / 'evil'} k.cu\n")
    (root / "--options-file=o.opts.cu").write_text("__global__ void k2(float* x) { }\n")
    _git(root, "add", "-A")  # staged, as the pre-commit hook sees a change
    check = subprocess.run([sys.executable, "-m", "kfbot", "check"], cwd=root,
                           capture_output=True, text=True, timeout=300)
    assert "--options-file=o.opts.cu: compiles" in check.stdout, check.stdout + check.stderr
    assert not ran.exists()


# ---- patches and kfbot's own folder --------------------------------------------------------


@pytest.mark.parametrize("name", ["b/../{escape}/x.cu", "{outside}/x.cu"])
def test_a_patch_naming_a_path_outside_is_refused_before_anything_is_written(
        linked: Path, tmp_path: Path, name: str) -> None:
    escape = f"escape-{tmp_path.name}"
    target = name.format(escape=escape, outside=tmp_path / "outside-dir")
    patch = tmp_path / "cand.patch"
    patch.write_text(f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+planted\n")
    with pytest.raises(KfbotError, match="is not a plain relative path"):
        load_candidate(patch, linked, ("csrc/softmax.cu",))
    assert not (Path(tempfile.gettempdir()) / escape).exists()
    assert not (tmp_path / "outside-dir").exists()


def test_a_renamed_file_outside_is_refused_too() -> None:
    text = "diff --git a/x.cu b/x.cu\nrename from x.cu\nrename to ../../x.cu\n"
    with pytest.raises(KfbotError, match=re.escape("'../../x.cu' is not a plain relative path")):
        patched_paths(text, "run.patch")
    assert patched_paths("--- a/x.cu\n+++ b/x.cu\n", "ok.patch") == ["x.cu"]


def test_lessons_are_not_written_through_a_kfbot_link(repos: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    """A pull request commits `.kfbot` as a link: the lessons kfbot adds to its base must
    not land where the link points."""
    work, _ = repos
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, work / ".kfbot")
    _git(work, "add", "-f", ".kfbot")
    _git(work, "-c", "user.name=M", "-c", "user.email=m@x", "commit", "-qm", "link")
    place = git.locate(work)
    with pytest.raises(KfbotError, match=r"\.kfbot: is a symbolic link"):
        commit_detached(place, "HEAD", {"csrc/softmax.cu": "// faster\n"}, "faster",
                        lessons=(LESSON,))
    assert list(outside.iterdir()) == []


def test_a_run_folder_is_not_read_through_a_kfbot_link(tmp_path: Path) -> None:
    root = _repo_with_commit(tmp_path / "repo")
    outside = tmp_path / "outside" / "runs" / "r1"
    outside.mkdir(parents=True)
    os.symlink(tmp_path / "outside", root / ".kfbot")
    done = subprocess.run([sys.executable, "-m", "kfbot", "reproduce", "r1", "--repo",
                           str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert ".kfbot: is a symbolic link" in done.stderr
