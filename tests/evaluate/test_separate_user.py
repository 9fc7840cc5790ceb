"""The separate-user sandbox (kfbot as root, no namespace) against what only it is open
to: root changes the modes of folders the untrusted ids can write while their commands run,
and no namespace ends with kfbot. Each attack runs as a real confined command in a kfbot
process of its own that holds a secret, with `KFBOT_SANDBOX=separate-user`.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from process_table import running

from kfbot.evaluate.sandbox.methods import CHOICE_VARIABLE

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the separate user needs root")

SECRET = "ghs_separateUserSecret0123456789"

# Swaps each of its files for a link to the target, and back, as fast as it can: a root
# that changes a mode by path in this folder changes the target's.
SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pairs = [(f"f{i}".encode(), f"l{i}".encode()) for i in range(16)]
for name, link in pairs:
    open(name, "w").close()
    os.symlink(sys.argv[1], link)
print("swapping", flush=True)
while True:
    for name, link in pairs:
        libc.renameat2(-100, name, -100, link, 2)  # RENAME_EXCHANGE
"""
DRIVER_RACE = """
import os, subprocess, sys, time
from kfbot.evaluate.sandbox import confined, untrusted_env
from kfbot.evaluate.sandbox.policy import finished
folder, target, swapper, seconds = sys.argv[1:5]
env = untrusted_env()
argv = confined([sys.executable, "-c", swapper, target], folder, [folder], env=env)
attacker = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE)
assert attacker.stdout.readline() == b"swapping\\n"
# At least 20 hand-overs, however slow a loaded machine makes each; more while time is left.
rounds, end, cap = 0, time.monotonic() + float(seconds), time.monotonic() + 90
while (rounds < 20 or time.monotonic() < end) and time.monotonic() < cap \
        and os.stat(target).st_mode & 0o777 == 0o600:
    finished(confined(["true"], folder, [folder], env=env))  # the next command's hand-over
    rounds += 1
attacker.kill()
attacker.wait()
finished(argv)
print(rounds)
"""
DAEMON = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]],"
          " start_new_session=True)\nprint('started', flush=True)\ntime.sleep(300)\n")
DRIVER_KILLED = """
import os, signal, subprocess, sys
from kfbot.evaluate.sandbox import confined, untrusted_env
folder, daemon, mark = sys.argv[1:4]
env = untrusted_env()
argv = confined([sys.executable, "-c", daemon, mark], folder, [folder], env=env)
proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE,
                        start_new_session=True)
assert proc.stdout.readline() == b"started\\n"
os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, a cancelled job: no atexit runs
"""


def _kfbot(driver: str, log: Path, *args: str) -> tuple[int, str]:
    """(exit status, output) of kfbot's code in a process of its own; the output goes to
    a file, since what survives kfbot would hold a pipe open."""
    env = {**os.environ, CHOICE_VARIABLE: "separate-user", "GITHUB_TOKEN": SECRET}
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-c", driver, *args], env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=120, check=False)
    return done.returncode, log.read_text()


def test_a_command_swapping_links_cannot_make_root_chmod_another_file(
        tmp_path: Path) -> None:
    """While a command of the group runs, each further command hands the shared folder
    over again: a name swapped for a link in between must not pass root's chmod on to
    the link's target (kfbot's venv, /etc/passwd)."""
    tmp_path.chmod(0o755)
    target = tmp_path / "roots-file"
    target.write_text("root's\n")
    target.chmod(0o600)
    folder = tmp_path / "shared"
    folder.mkdir()
    code, said = _kfbot(DRIVER_RACE, tmp_path / "log", str(folder), str(target), SWAPPER, "3")
    assert code == 0, said[-3000:]
    assert int(said.split()[-1]) >= 20  # the folder was handed over again and again
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert (target.stat().st_uid, target.stat().st_gid) == (0, 0)


def test_a_setsid_daemon_dies_when_kfbot_is_killed(tmp_path: Path) -> None:
    """No namespace ends with a kfbot that is killed outright: the launcher, root's, must
    kill every process of the id when kfbot is gone."""
    mark = f"daemon-killed-{tmp_path.name}-{os.getpid()}"
    folder = tmp_path / "scratch"
    folder.mkdir()
    above = _modes_above(sys.prefix, sys.base_prefix, str(tmp_path))
    try:
        code, said = _kfbot(DRIVER_KILLED, tmp_path / "log", str(folder), DAEMON, mark)
    finally:  # a killed kfbot gives no folder its mode back (/root, where Python lives)
        for path, mode in above.items():
            path.chmod(mode)
    assert code == -signal.SIGKILL, said[-3000:]
    assert not running(mark, within_s=10.0)


def _modes_above(*paths: str) -> dict[Path, int]:
    folders = {f for p in paths for f in (Path(p).resolve(), *Path(p).resolve().parents)}
    return {f: stat.S_IMODE(f.stat().st_mode) for f in folders}


DETECT = "from kfbot.evaluate.sandbox import detect; print(detect().summary())"


def _detect(python: str, **env: str) -> str:
    """What `python` finds when only the separate user may be tried."""
    done = subprocess.run([python, "-c", DETECT], text=True, capture_output=True, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                               CHOICE_VARIABLE: "separate-user", **env}, timeout=120)
    if "No module named" in done.stderr:
        pytest.skip(f"{python} cannot import kfbot: {done.stderr.splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_folder_others_can_write_inside_kfbots_venv_is_refused(tmp_path: Path) -> None:
    """The venv itself is root's, but its site-packages is not: the command would put a
    `.pth` or a module there that kfbot imports later, holding the secrets."""
    tmp_path.chmod(0o755)
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    assert _detect(str(venv / "bin" / "python")).startswith("sandbox: separate-user")
    site = next(venv.glob("lib/python3*/site-packages"))
    site.chmod(0o777)
    assert _detect(str(venv / "bin" / "python")) == (
        f"no sandbox: separate user: {site} is writable by group or others: the command "
        f"could rewrite kfbot's interpreter or packages (chmod go-w {site})")


def _checkout(folder: Path) -> Path:
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=60)
    return folder


@pytest.mark.parametrize("kept", ["RUNNER_TOOL_CACHE", "GITHUB_WORKSPACE"])
def test_a_tool_cache_or_git_others_can_write_is_refused(tmp_path: Path, kept: str) -> None:
    tmp_path.chmod(0o755)
    folder = tmp_path / kept.lower()
    if kept == "GITHUB_WORKSPACE":  # the checkout's .git/config: an `insteadOf`, a proxy
        writable = _checkout(folder) / ".git" / "config"
        mode = 0o666
    else:
        writable, mode = folder, 0o777
        folder.mkdir()
    python = "/usr/bin/python3"
    assert _detect(python, **{kept: str(folder)}).startswith("sandbox: separate-user")
    writable.chmod(mode)
    assert _detect(python, **{kept: str(folder)}) == (
        f"no sandbox: separate user: {writable} is writable by group or others: the "
        f"command could change what kfbot runs or pushes (chmod go-w {writable})")


SWAP_CWD = ("import os, sys\nos.chdir('..')\nos.rename('sub', 'old')\n"
            "os.symlink(sys.argv[1], 'sub')\n")
DRIVER_RESTORE = """
import subprocess, sys
from kfbot.evaluate.sandbox import confined, untrusted_env
from kfbot.evaluate.sandbox.policy import finished
folder, swap, victim = sys.argv[1:4]
env = untrusted_env()
argv = confined([sys.executable, "-c", swap, victim], folder + "/sub", [folder], env=env)
subprocess.run(argv, cwd=folder + "/sub", env=env, check=True)
finished(argv)
"""


def test_a_folder_swapped_for_a_link_does_not_get_its_mode_at_exit(tmp_path: Path) -> None:
    """kfbot opens the way to the command's working folder and closes it again at exit:
    by then the command may have put a link to another folder at that path."""
    tmp_path.chmod(0o755)
    folder = tmp_path / "scratch"
    (folder / "sub").mkdir(parents=True)
    for path in (folder, folder / "sub"):
        path.chmod(0o700)  # as mkdtemp makes it: kfbot must open the way
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o755)
    code, said = _kfbot(DRIVER_RESTORE, tmp_path / "log", str(folder), SWAP_CWD, str(victim))
    assert code == 0, said[-3000:]
    assert (folder / "sub").is_symlink()  # the command did swap it
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


LITTER = """
import os, sys
mark = sys.argv[1]
for shared in ("/tmp", "/var/tmp", "/dev/shm"):
    os.makedirs(f"{shared}/{mark}-dir/deeper")
    open(f"{shared}/{mark}-dir/deeper/file", "w").write("left behind")
    open(f"{shared}/{mark}-file", "w").write("left behind")
    os.symlink(sys.argv[2], f"{shared}/{mark}-link")
"""
DRIVER_LITTER = """
import sys
from pathlib import Path
from kfbot.evaluate.sandbox.processes import run_process
from kfbot.evaluate.sandbox import untrusted_env
folder, litter, mark, kept = Path(sys.argv[1]), *sys.argv[2:5]
ran = run_process([sys.executable, "-c", litter, mark, kept], folder, untrusted_env(), 60,
                  folder / "log", writable=[folder])
assert ran.exit_code == 0, ran.tail
"""


def test_what_the_id_left_in_tmp_and_dev_shm_is_removed(tmp_path: Path) -> None:
    """The machine's /tmp, /var/tmp and /dev/shm are shared: what the command left there
    would fill the disk or memory and wait for the next job. Root's files stay."""
    mark = f"litter-{tmp_path.name}-{os.getpid()}"
    kept = Path("/tmp", f"{mark}-roots")
    kept.write_text("root's, beside the litter\n")
    folder = tmp_path / "scratch"
    folder.mkdir()
    try:
        code, said = _kfbot(DRIVER_LITTER, tmp_path / "log", str(folder), LITTER, mark,
                            str(kept))
        assert code == 0, said[-3000:]
        assert _litter(mark) == [kept]
        assert kept.read_text() == "root's, beside the litter\n"
    finally:
        for path in _litter(mark):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _litter(mark: str) -> list[Path]:
    return sorted(p for shared in ("/tmp", "/var/tmp", "/dev/shm")
                  for p in Path(shared).glob(f"{mark}-*"))


DRIVER_WHOAMI = """
import subprocess, sys
from kfbot.evaluate.sandbox import confined, untrusted_env
folder = sys.argv[1]
env = untrusted_env()
code = "import getpass, os; print(getpass.getuser(), os.getuid(), os.path.expanduser('~'))"
argv = confined([sys.executable, "-c", code], folder, [folder], env=env)
print(subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True).stdout)
"""


def test_the_lent_id_has_a_user_name_without_a_passwd_entry(tmp_path: Path) -> None:
    """torch asks `getpass.getuser()` for its extension cache: the lent id, which has no
    passwd entry, must still have a name (it once stopped the GPU worker's start)."""
    tmp_path.chmod(0o755)
    code, said = _kfbot(DRIVER_WHOAMI, tmp_path / "log", str(tmp_path))
    assert code == 0, said
    name, uid, home = said.split()
    assert name == f"kfbot{uid}" and int(uid) != 0 and home != "/root", said
