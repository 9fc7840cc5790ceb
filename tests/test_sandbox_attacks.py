"""The code kfbot runs on purpose, attacking it: each attack planted where an attacker
would plant it (a repository's `setup.py`, its test file, a candidate loaded by the GPU
worker) and run through kfbot's own spawn points, in each sandbox this machine has:
bubblewrap, `unshare` (bubblewrap taken off PATH), and a separate user where the tests run
as root (`KFBOT_SANDBOX=separate-user`). None reaches a secret, writes
kfbot's files, the checkout's `.git` or anything outside the folders it may write, and
nothing it starts outlives the run. Where no sandbox works, kfbot refuses while it holds
a secret.

The attacks run in a separate kfbot process whose PATH (a real condition, as on a runner
without bubblewrap) or `KFBOT_SANDBOX` decides the sandbox, and report what they could do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_table import running

import kfbot
from kfbot.evaluate.sandbox import ALLOW_VARIABLE, held_secrets
from kfbot.evaluate.sandbox.methods import CHOICE_VARIABLE

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example"
SECRET = "ghs_sandboxAttackSecret0123456789"
METHODS = ("bwrap", "unshare", "separate-user")
PLANTED = "planted_by_attack"

# What the planted code does, wherever it runs; {...} are filled in per run.
ATTACK = """
import glob, json, os, resource, subprocess, sys

def attack(mark, git_config, outside):
    report = {{}}

    def attempt(name, path, mode="w"):
        try:
            with open(path, mode) as f:
                f.write("planted\\n")
            report[name] = "written"
        except OSError as exc:
            report[name] = exc.strerror

    import kfbot
    attempt("package", os.path.join(os.path.dirname(kfbot.__file__), {planted!r} + ".py"))
    attempt("venv", os.path.join(sys.prefix, {planted!r} + ".pth"))
    attempt("git_config", git_config, "a")
    attempt("outside", outside)
    attempt("tmp", "/tmp/" + mark)
    environ = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            environ.append(open(path, "rb").read().decode(errors="replace"))
        except OSError:
            pass
    report["environ"] = "\\n".join(environ)
    report["pids"] = sorted(int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*"))
    report["file_limit"] = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    tmp = os.statvfs("/tmp")
    report["tmp_bytes"] = tmp.f_blocks * tmp.f_frsize
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", mark],
                              start_new_session=True, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report["daemon"] = daemon.pid
    return report
"""
SETUP_PY = ATTACK + """
report = attack({mark!r}, {git_config!r}, {outside!r})
report["copy"] = open("written-in-the-copy.txt", "w").write("the copy is writable")
try:  # a sparse file: one byte past the cap takes no disk
    with open("beyond-the-cap.bin", "wb") as f:
        f.seek(report["file_limit"])
        f.write(b"x")
    report["beyond_cap"] = "written"
except OSError as exc:
    report["beyond_cap"] = exc.strerror
with open("attack.json", "w") as f:
    json.dump(report, f)
"""
TEST_PY = ATTACK + """
def test_attack():
    report = attack({mark!r}, ".git/config", {outside!r})
    try:
        open("planted_in_checkout.py", "w").write("x")
        report["checkout"] = "written"
    except OSError as exc:
        report["checkout"] = exc.strerror
    print("ATTACK " + json.dumps(report))
"""

DRIVER_SETUP = """
import json, sys
from pathlib import Path
from kfbot.evaluate.build.layouts.own import OwnBuilder, own_recipe
from kfbot.evaluate.sandbox.processes import run_process
from kfbot.evaluate.sandbox import sandbox, untrusted_env
root, scratch = Path(sys.argv[1]), Path(sys.argv[2])
build = OwnBuilder(scratch, timeout_s=120).original(root, own_recipe("setup.py"))
crash = run_process(["sh", "-c", "kill -SEGV $$"], scratch, untrusted_env(), 30,
                    scratch / "crash.log")
print(json.dumps({"method": sandbox().method, "why": build.why, "tail": build.tail,
                  "workshop": str(build.workshop), "crash": crash.exit_code}))
"""
DRIVER_CAPTURE = """
import json, sys
from pathlib import Path
from kfbot.evaluate.capture.collect import capture_signatures
from kfbot.evaluate.sandbox import sandbox
from kfbot.evaluate.capture.signature import OpRef
result = capture_signatures(Path(sys.argv[1]), ["tests/test_attack.py"],
                            [OpRef.parse("myops.scale")], timeout_s=120)
print(json.dumps({"method": sandbox().method, "tail": result.runs[0].ran.tail}))
"""
DRIVER_WORKER = """
import json, sys
from kfbot.evaluate.sandbox import sandbox
from kfbot.evaluate.worker.session import WorkerSession
folder, repo, mark, outside = sys.argv[1:5]
with WorkerSession(python_path=[folder], cwd=repo, startup_timeout_s=120) as session:
    result = session.call("planted_job:attack_job",
                          {"mark": mark, "git_config": repo + "/.git/config",
                           "outside": outside}, 120)
print(json.dumps({"method": sandbox().method, "status": result.status,
                  "reason": result.reason, "value": result.value}))
"""


# ---- the machine's sandboxes, chosen by PATH ------------------------------------------------


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PATH as on a runner without bubblewrap and without unshare (kfbot is told to try
    only those two, since a root one would use a separate user)."""
    return _path_without(tmp_path_factory.mktemp("bin-bare"), {"bwrap", "unshare"})


@pytest.fixture(scope="module", params=METHODS)
def method_path(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """(method, environment) under which kfbot picks that sandbox; skipped where it
    cannot (the separate user where the tests do not run as root)."""
    method = str(request.param)
    env = {"PATH": os.environ["PATH"]}
    if method == "unshare":
        env["PATH"] = _path_without(tmp_path_factory.mktemp("bin-no-bwrap"), {"bwrap"})
    if method == "separate-user":
        env[CHOICE_VARIABLE] = method
    found = _detect(**env)
    if found["method"] != method:
        pytest.skip(f"{method} does not work here: {found['failed'] or found['method']}")
    return method, env


def _denied(method: str) -> str:
    """What a write to a folder kept from the command says: a read-only mount, or a
    folder that is root's when the command runs as a user of its own."""
    return "Permission denied" if method == "separate-user" else "Read-only file system"


def _path_without(folder: Path, left_out: set[str]) -> str:
    """A folder of links to every program on PATH but `left_out`."""
    folder.mkdir(exist_ok=True)
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link = folder / name
            if name not in left_out and not link.exists() and \
                    os.access(os.path.join(directory, name), os.X_OK):
                link.symlink_to(os.path.join(directory, name))
    return str(folder)


def _detect(**env: str) -> dict[str, Any]:
    code = ("import json; from kfbot.evaluate.sandbox import detect; box = detect(); "
            "print(json.dumps({'method': box.method, 'failed': [a.line() for a in box.failed],"
            " 'advice': box.advice()}))")
    base = {k: v for k, v in os.environ.items() if k != CHOICE_VARIABLE}
    done = subprocess.run([sys.executable, "-c", code], env={**base, **env},
                          capture_output=True, text=True, timeout=120, check=True)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _drive(driver: str, sandbox_env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run kfbot's code in a process of its own that holds a secret in its environment."""
    base = {k: v for k, v in os.environ.items() if k != CHOICE_VARIABLE}
    env = {**base, **sandbox_env, "GITHUB_TOKEN": SECRET, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", driver, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def secret_holder() -> Iterator[None]:
    """Another process that holds the secret in its environment, as `git push` does."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={"PATH": os.environ["PATH"], "GH_TOKEN": SECRET})
    yield
    holder.kill()
    holder.wait()


def _planted_files() -> list[Path]:
    return [Path(kfbot.__file__).parent / f"{PLANTED}.py", Path(sys.prefix) / f"{PLANTED}.pth"]


@pytest.fixture(autouse=True, scope="module")
def _remove_what_an_escape_planted() -> Iterator[None]:
    yield
    for path in _planted_files():  # only there if an attack got through
        path.unlink(missing_ok=True)


def _checkout(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "fixture"], cwd=root, check=True)
    return root


def _fill(template: str, **values: str) -> str:
    return template.format(planted=PLANTED, **values)


# ---- a repository's setup.py, run by the repository's own build ----------------------------


@pytest.fixture(scope="module")
def setup_attack(method_path: tuple[str, dict[str, str]], secret_holder: None,
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    method, path = method_path
    tmp = tmp_path_factory.mktemp(f"setup-{method}")
    mark = f"daemon-{method}-{tmp.name}-{os.getpid()}"
    root = tmp / "repo"
    root.mkdir()
    git_config = root / ".git" / "config"
    outside = tmp / "outside.txt"
    setup = _fill(SETUP_PY, mark=mark, git_config=str(git_config), outside=str(outside))
    _checkout(root, {"setup.py": setup, "pkg/__init__.py": ""})
    config_before = git_config.read_bytes()
    ran = _drive(DRIVER_SETUP, path, str(root), str(tmp / "scratch"))
    report = json.loads((Path(ran["workshop"]) / "attack.json").read_text())
    return {"ran": ran, "report": report, "mark": mark, "outside": outside,
            "config_before": config_before, "git_config": git_config, "method": method}


def test_setup_py_runs_in_the_sandbox(setup_attack: dict[str, Any]) -> None:
    assert setup_attack["ran"]["method"] == setup_attack["method"]
    assert setup_attack["report"]["copy"] > 0  # it ran, and could write its own copy


def test_setup_py_cannot_rewrite_kfbots_package_or_environment(
        setup_attack: dict[str, Any]) -> None:
    report = setup_attack["report"]
    assert report["package"] == report["venv"] == _denied(setup_attack["method"])
    assert not any(path.exists() for path in _planted_files())


def test_setup_py_cannot_edit_the_checkouts_git_config(setup_attack: dict[str, Any]) -> None:
    # Not even seen here: the build runs in a copy, and this checkout lies in /tmp, which
    # a namespace makes private (the capture's test below runs in a checkout it sees); a
    # separate user sees it, but it is root's.
    assert setup_attack["report"]["git_config"] in (_denied(setup_attack["method"]),
                                                    "No such file or directory")
    assert setup_attack["git_config"].read_bytes() == setup_attack["config_before"]


def test_setup_py_sees_no_process_of_kfbot_or_anyone_else(
        setup_attack: dict[str, Any]) -> None:
    report = setup_attack["report"]
    assert SECRET not in report["environ"]
    if setup_attack["method"] == "separate-user":  # no PID namespace: sees, cannot read
        assert len(report["pids"]) > 4 and "GITHUB_TOKEN" not in report["environ"]
    else:
        assert max(report["pids"]) < 100 and len(report["pids"]) <= 4  # its own namespace


def test_setup_py_writes_nothing_outside_its_copy(setup_attack: dict[str, Any]) -> None:
    report = setup_attack["report"]
    # (Where the path lies in /tmp, the write may land in the sandbox's private /tmp.)
    assert not setup_attack["outside"].exists()
    assert report["tmp"] == "written"
    _check_tmp(setup_attack["method"], setup_attack["mark"])


def _check_tmp(method: str, mark: str) -> None:
    """What the attack wrote in /tmp is gone: a namespace's /tmp is private, and what a
    separate user left in the machine's /tmp is removed once its processes are killed."""
    assert not Path("/tmp", mark).exists()


def test_a_setsid_daemon_does_not_outlive_the_build(setup_attack: dict[str, Any]) -> None:
    assert setup_attack["report"]["daemon"] > 0  # it was started
    assert not running(setup_attack["mark"])


def test_the_sandbox_caps_files_and_tmp(setup_attack: dict[str, Any]) -> None:
    from kfbot.evaluate.sandbox.methods import FILE_BYTES, TMP_BYTES

    assert setup_attack["report"]["file_limit"] == FILE_BYTES
    assert setup_attack["report"]["beyond_cap"] == "File too large"
    if setup_attack["method"] != "separate-user":  # which shares the machine's /tmp
        assert setup_attack["report"]["tmp_bytes"] == TMP_BYTES


def test_a_crash_in_the_sandbox_reports_its_signal(setup_attack: dict[str, Any]) -> None:
    assert setup_attack["ran"]["crash"] == -11  # SIGSEGV, not the 139 a shell would say


# ---- a repository's test file, run by the capture ------------------------------------------


def test_a_test_file_cannot_touch_the_checkout_or_see_kfbot(
        method_path: tuple[str, dict[str, str]], secret_holder: None, tmp_path: Path) -> None:
    method, path = method_path
    mark = f"daemon-capture-{method}-{tmp_path.name}-{os.getpid()}"
    outside = tmp_path / "outside.txt"
    root = _checkout(tmp_path / "repo", {
        "myops.py": "def scale(x, alpha=2.0):\n    return x * alpha\n",
        "tests/test_attack.py": _fill(TEST_PY, mark=mark, outside=str(outside))})
    config_before = (root / ".git" / "config").read_bytes()
    ran = _drive(DRIVER_CAPTURE, path, str(root))
    assert "\nATTACK " in "\n" + ran["tail"], ran["tail"]
    line = next(x for x in ran["tail"].splitlines() if x.startswith("ATTACK "))
    report = json.loads(line.removeprefix("ATTACK "))
    assert ran["method"] == method
    assert report["git_config"] == report["checkout"] == _denied(method)
    assert (root / ".git" / "config").read_bytes() == config_before
    assert not (root / "planted_in_checkout.py").exists() and not outside.exists()
    assert report["package"] == report["venv"] == _denied(method)
    assert SECRET not in report["environ"]
    assert not running(mark)
    _check_tmp(method, mark)


# ---- a candidate's code, loaded by the GPU worker ------------------------------------------


def test_a_candidate_in_the_worker_cannot_escape(
        method_path: tuple[str, dict[str, str]], secret_holder: None, tmp_path: Path) -> None:
    method, path = method_path
    mark = f"daemon-worker-{method}-{tmp_path.name}-{os.getpid()}"
    folder = tmp_path / "candidate"
    folder.mkdir()
    (folder / "planted_job.py").write_text(_fill(ATTACK) + (
        "\ndef attack_job(payload):\n"
        "    return attack(payload['mark'], payload['git_config'], payload['outside'])\n"))
    root = _checkout(tmp_path / "repo", {"README.md": "a repository\n"})
    outside = tmp_path / "outside.txt"
    ran = _drive(DRIVER_WORKER, path, str(folder), str(root), mark, str(outside))
    assert (ran["method"], ran["status"]) == (method, "ok"), ran["reason"]
    report = ran["value"]
    assert report["package"] == report["venv"] == report["git_config"] == _denied(method)
    assert SECRET not in report["environ"]
    assert not outside.exists() and not any(p.exists() for p in _planted_files())
    assert not running(mark)  # the session closed: its namespace and the daemon with it
    _check_tmp(method, mark)


# ---- no sandbox ----------------------------------------------------------------------------


def test_without_any_sandbox_the_reasons_and_the_fix_are_named(bare_path: str) -> None:
    found = _detect(PATH=bare_path, **{CHOICE_VARIABLE: "bwrap,unshare"})
    assert found["method"] == "none"
    assert found["failed"] == ["bwrap: `bwrap` is not on PATH", "unshare: `unshare` is not on PATH"]
    assert "apt-get install bubblewrap" in found["advice"]
    assert "user namespaces" in found["advice"]


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
DETECT = ("from kfbot.evaluate.sandbox import detect; box = detect(); "
          "print(box.summary()); print(box.advice())")


def _detect_with(python: str, *wrapper: str) -> subprocess.CompletedProcess[str]:
    """What `python` finds when only the separate user may be used."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), CHOICE_VARIABLE: "separate-user"}
    done = subprocess.run([*wrapper, python, "-c", DETECT], env=env, capture_output=True,
                          text=True, timeout=120, cwd="/")
    if "No module named" in done.stderr:
        pytest.skip(f"{python} cannot import kfbot: {done.stderr.splitlines()[-1]}")
    return done


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs kfbot as an unprivileged user: needs root and setpriv")
def test_a_separate_user_needs_kfbot_to_be_root() -> None:
    done = _detect_with("/usr/bin/python3", *AS_NOBODY)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "no sandbox: separate user: kfbot is not root"
    assert "run kfbot as root" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the separate user needs root")
def test_a_separate_user_is_refused_where_others_can_write_kfbots_python(
        tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    tmp_path.chmod(0o755)
    venv.chmod(0o777)  # world-writable, not sticky
    done = _detect_with(str(venv / "bin" / "python"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        f"no sandbox: separate user: {venv} is writable by group or others: the command "
        f"could rewrite kfbot's interpreter or packages (chmod go-w {venv})")


def _verify(path: str, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`kfbot verify` on a runner with `path`, holding no secret but those in `env`."""
    left_out = {*held_secrets(os.environ), ALLOW_VARIABLE}
    clean = {k: v for k, v in os.environ.items() if k not in left_out}
    tried = {CHOICE_VARIABLE: "bwrap,unshare"}
    return subprocess.run(
        [sys.executable, "-m", "kfbot", "verify", "saxpy_kernel", "--repo", str(EXAMPLE),
         *extra], env={**clean, "PATH": path, **tried, **env}, capture_output=True, text=True,
        timeout=600)


def test_no_sandbox_and_a_secret_held_is_a_refusal(bare_path: str, tmp_path: Path) -> None:
    done = _verify(bare_path, ANTHROPIC_API_KEY=SECRET, KFBOT_CACHE=str(tmp_path))
    assert done.returncode == 3, done.stderr
    assert "will not run the repository's code or candidates outside a sandbox" in done.stderr
    assert "ANTHROPIC_API_KEY" in done.stderr and SECRET not in done.stderr
    assert "bwrap: `bwrap` is not on PATH; unshare: `unshare` is not on PATH" in done.stderr
    assert "apt-get install bubblewrap" in done.stderr and "--allow-unsandboxed" in done.stderr


def test_a_sandbox_name_that_is_no_method_is_a_usage_error(tmp_path: Path) -> None:
    done = _verify(os.environ["PATH"], KFBOT_SANDBOX="bwrap,jail", KFBOT_CACHE=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "KFBOT_SANDBOX='bwrap,jail': jail names no sandbox; use one or more of bwrap, " \
        "unshare, separate-user" in done.stderr


@pytest.mark.parametrize("allowed", [("--allow-unsandboxed",), ()])
def test_allowed_or_without_a_secret_it_runs_unsandboxed_and_says_so(
        bare_path: str, tmp_path: Path, allowed: tuple[str, ...]) -> None:
    secret = {"ANTHROPIC_API_KEY": SECRET} if allowed else {}
    done = _verify(bare_path, *allowed, KFBOT_CACHE=str(tmp_path), **secret)
    assert "outside a sandbox" not in done.stderr
    said = [line for line in done.stderr.splitlines()
            if "running the repository's code without a sandbox" in line]
    assert len(said) == 1, done.stderr  # said once, however many processes ran
    assert ("ANTHROPIC_API_KEY (allowed)" in said[0]) == bool(allowed)


# ---- kfbot's own memory --------------------------------------------------------------------

# Opening the memory is the test (what a reader then seeks to is its own business).
PEEK = ("import os\nfor name in ('mem', 'environ'):\n    try:\n"
        "        open(f'/proc/{os.getppid()}/{name}', 'rb').close()\n"
        "        print(name, 'opened')\n"
        "    except OSError as exc:\n        print(name, exc.strerror)\n")
HOLDER = ("import subprocess, sys\n{protect}"
          "subprocess.run([sys.executable, '-c', {peek!r}], env={{'PATH': '/usr/bin:/bin'}})\n")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs kfbot as an unprivileged user: needs root and setpriv")
@pytest.mark.parametrize("protected", [True, False])
def test_kfbots_memory_is_out_of_reach_of_its_users_other_processes(protected: bool) -> None:
    """As another user (root may read any memory): a child of kfbot of the same user can
    open neither kfbot's memory nor its environment once kfbot protected itself."""
    python = "/usr/bin/python3"
    protect = ("from kfbot.evaluate.sandbox.credentials import protect\nprotect()\n"
               if protected else "")
    code = HOLDER.format(protect=protect, peek=PEEK)
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GITHUB_TOKEN": SECRET},
        capture_output=True, text=True, timeout=120, cwd="/")
    if "No module named" in done.stderr:
        pytest.skip(f"{python} cannot import kfbot: {done.stderr.splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    expected = "Permission denied" if protected else "opened"
    assert done.stdout.split("\n")[:2] == [f"mem {expected}", f"environ {expected}"]


# ---- what a command leaves behind, however it ends --------------------------------------

DAEMON = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]],"
          " start_new_session=True)\nprint('started', flush=True)\ntime.sleep(100)\n")
DRIVER_TIMEOUT = """
import json, sys
from pathlib import Path
from kfbot.evaluate.sandbox.processes import run_process
from kfbot.evaluate.sandbox import sandbox, untrusted_env
folder, daemon, mark = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
ran = run_process([sys.executable, "-c", daemon, mark], folder, untrusted_env(), 3,
                  folder / "log", writable=[folder])
print(json.dumps({"method": sandbox().method, "timed_out": ran.timed_out, "tail": ran.tail}))
"""
DRIVER_EXIT = """
import json, subprocess, sys, time
from kfbot.evaluate.sandbox import confined, sandbox, untrusted_env
folder, daemon, mark = sys.argv[1:4]
env = untrusted_env()
argv = confined([sys.executable, "-c", daemon, mark], folder, [folder], env=env)
proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE,
                        start_new_session=True)
said = proc.stdout.readline().decode()
print(json.dumps({"method": sandbox().method, "said": said}))
# kfbot ends here with the command still running: nothing it started may outlive it.
"""


@pytest.mark.parametrize("driver", [DRIVER_TIMEOUT, DRIVER_EXIT], ids=["timeout", "exit"])
def test_a_setsid_daemon_dies_on_a_timeout_and_when_kfbot_exits(
        method_path: tuple[str, dict[str, str]], tmp_path: Path, driver: str) -> None:
    method, env = method_path
    mark = f"daemon-end-{method}-{tmp_path.name}-{os.getpid()}"
    folder = tmp_path / "scratch"
    folder.mkdir()
    ran = _drive(driver, env, str(folder), DAEMON, mark)
    assert ran["method"] == method
    assert ran.get("timed_out", True) and "started" in ran.get("tail", ran.get("said", ""))
    assert not running(mark)


# ---- two commands at once, one written folder (a candidate's worker and its judge) ----------

WRITER = """
import os, sys, time
name = sys.argv[1]
open(name + "-1", "w").write("first")
os.makedirs(name + "-dir", exist_ok=True)
open(name + "-dir/inner", "w").write("x")
print("wrote", flush=True)
sys.stdin.readline()  # until the other command has started
open(name + "-2", "w").write("after the other started")
open(name + "-dir/inner", "a").write("y")
try:
    os.rename(".git", "moved-git")
    print("moved .git")
except OSError as exc:
    print("git", exc.strerror)
"""
DRIVER_SHARED = """
import json, subprocess, sys
from kfbot.evaluate.sandbox import confined, sandbox, untrusted_env
from kfbot.evaluate.sandbox.policy import finished
folder, writer = sys.argv[1:3]
env = untrusted_env()
def start(name):
    argv = confined([sys.executable, "-c", writer, name], folder, [folder], env=env)
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline() == "wrote\\n"
    return argv, proc
first = start("a")
second = start("b")
said = []
for argv, proc in (first, second):
    said.append(proc.communicate("go\\n")[0].strip())
    finished(argv)
print(json.dumps({"method": sandbox().method, "said": said}))
"""


def test_commands_at_once_share_their_written_folder_but_not_its_git(
        method_path: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    method, env = method_path
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)  # kfbot lets the command through, and closes it again
    folder = _checkout(closed / "scratch", {"README.md": "a copy\n"})
    target = tmp_path / "not-for-the-command.txt"
    target.write_text("root's\n")
    target.chmod(0o644)
    (folder / "link").symlink_to(target)  # the folder is shared: the link's target is not
    ran = _drive(DRIVER_SHARED, env, str(folder), WRITER)
    assert closed.stat().st_mode & 0o7777 == 0o700  # restored when kfbot exited
    assert (target.stat().st_mode & 0o7777, target.stat().st_gid) == (0o644, os.getgid())
    assert ran["method"] == method
    # (A mount point cannot be renamed; a separate user's .git sits in a sticky folder.)
    expected = "Operation not permitted" if method == "separate-user" else \
        "Device or resource busy"
    assert ran["said"] == [f"git {expected}"] * 2
    for name in ("a", "b"):
        assert (folder / f"{name}-2").read_text() == "after the other started"
        assert (folder / f"{name}-dir" / "inner").read_text() == "xy"
    assert (folder / ".git" / "config").is_file() and not (folder / "moved-git").exists()
