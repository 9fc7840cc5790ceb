"""The first program inside a sandbox: finish setting it up, then become the command.

Run as `python -I -S launch.py SPEC COMMAND...` by `kfbot.evaluate.sandbox.methods`, so it
imports nothing but the standard library (no site, no working directory on the path).
SPEC is JSON; its "mode" says how much is left to do:

- "bwrap": bubblewrap made the mounts and the PID namespace; set the limits and exec.
- "unshare": `unshare --user --map-root-user --mount --pid --fork` made empty namespaces
  and this process is their PID 1. It makes every mount read-only, mounts a fresh /proc, a
  minimal /dev (the GPU's nodes kept), private tmpfs over /tmp and /run, binds back the
  paths the command may read or write, then starts the command in a nested user namespace
  (so the command holds no capability over these mounts and cannot undo them) and waits:
  when the command ends, this process ends, and the kernel kills whatever the command left
  in the namespace, `setsid` daemons included.
- "separate-user": kfbot is root and no namespace could be made. Start the command as the
  unused uid and gid in SPEC (no supplementary groups, no new privileges), wait for it,
  then kill every process of that uid (`setsid` daemons included).
- "kill": kill every process of the uid in SPEC, from a process that takes that uid.

A setup step that fails exits with 125 and one line on stderr. A command killed by signal N
is reported as exit status 128 + N, as a shell does.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys
import threading
import time
from typing import Any

SETUP_FAILED = 125

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
_KILL_ROUNDS = 10_000
# How soon a command whose kfbot died is killed (its own end is seen at once).
_ORPHAN_CHECK_S = 0.5
# The flags of a mount that a bind remount must repeat (statvfs reports them with the same
# values); leaving out one that the outer namespace locked makes the kernel refuse.
_KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # noatime, nodiratime, relatime
# Device nodes a program expects; everything else under /dev stays out (a raw disk is
# writable by its owner, and the owner may be who runs kfbot).
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# /proc files that change the whole machine: read-only, as bubblewrap does.
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def main(argv: list[str]) -> None:
    spec: dict[str, Any] = json.loads(argv[1])
    command = argv[2:]
    try:
        if spec["mode"] == "unshare":
            # Opened while /proc is still the machine's: kfbot is out of sight after.
            kfbot = os.open(f"/proc/{int(spec['parent'])}", os.O_RDONLY | os.O_DIRECTORY)
            build_namespace(spec)
            code = run_as_init(spec, command, kfbot)
            os._exit(code)
        if spec["mode"] == "separate-user":
            os._exit(run_as_user(spec, command))
        if spec["mode"] == "kill":
            kill_user(int(spec["uid"]))
            os._exit(0)
        limit(spec)
    except (SetupError, OSError) as exc:
        sys.stderr.write(f"kfbot sandbox: {exc}\n")
        os._exit(SETUP_FAILED)
    start(spec, command)


# ---- the command ------------------------------------------------------------------------


def limit(spec: dict[str, Any]) -> None:
    size = int(spec["file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def start(spec: dict[str, Any], command: list[str]) -> None:
    env = {**os.environ, **spec["env"]}
    os.chdir(spec["cwd"])  # after the mounts: the path now leads to the bound folder
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        sys.stderr.write(f"kfbot sandbox: cannot run {command[0]}: {exc.strerror}\n")
        os._exit(127)


def run_as_init(spec: dict[str, Any], command: list[str], kfbot: int) -> int:
    """Start the command and reap every process until it ends; its status. Should kfbot
    (whose /proc folder `kfbot` is) die first, this init ends, and the kernel kills
    every process of the namespace with it: `unshare --kill-child` acts only when
    `unshare` dies, and nothing kills `unshare` when kfbot does."""
    child = os.fork()
    if child == 0:
        os.close(kfbot)
        try:
            os.setsid()
            drop_privileges(int(spec["uid"]), int(spec["gid"]))
            limit(spec)
        except OSError as exc:
            sys.stderr.write(f"kfbot sandbox: {exc}\n")
            os._exit(SETUP_FAILED)
        start(spec, command)
    # The command's pipes must close when the command does.
    os.closerange(3, kfbot)
    os.closerange(kfbot + 1, 1 << 16)
    threading.Thread(target=_end_with, args=(kfbot,), daemon=True).start()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return SETUP_FAILED
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _end_with(kfbot: int) -> None:
    """End this process (the namespace's init) once the process whose /proc folder is
    `kfbot` has exited (its folder empty, or it a zombie)."""
    while True:
        time.sleep(_ORPHAN_CHECK_S)
        try:
            fd = os.open("stat", os.O_RDONLY, dir_fd=kfbot)
            try:
                state = os.read(fd, 4096).rsplit(b")", 1)[-1].split()[:1]
            finally:
                os.close(fd)
        except OSError:
            state = []
        if state in ([], [b"Z"], [b"X"]):
            os._exit(SETUP_FAILED)


def drop_privileges(uid: int, gid: int) -> None:
    """Enter a nested user namespace where the caller's own ids are mapped back: the
    command then holds no capability over the mounts made here, which stay as they are."""
    if _libc.unshare(CLONE_NEWUSER) != 0:
        raise _os_error("unshare(CLONE_NEWUSER)")
    _write("/proc/self/uid_map", f"{uid} 0 1\n")
    _write("/proc/self/setgroups", "deny\n")
    _write("/proc/self/gid_map", f"{gid} 0 1\n")


# ---- a separate user (separate-user and kill modes) -------------------------------------


def run_as_user(spec: dict[str, Any], command: list[str]) -> int:
    """Start the command as the spec's uid and wait for it; then kill all that uid runs."""
    uid = int(spec["uid"])
    # Held until the wait, so that the command's end is never missed (and unblocked in it).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    child = os.fork()
    if child == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            become(uid, int(spec["gid"]))
            os.umask(int(spec["umask"]))  # what it writes, the next command may change
            limit(spec)
        except OSError as exc:
            sys.stderr.write(f"kfbot sandbox: {exc}\n")
            os._exit(SETUP_FAILED)
        start(spec, command)
    os.closerange(3, 1 << 16)  # the command's pipes must close when the command does
    status = _wait_while_kfbot_lives(child, uid, int(spec["parent"]))
    _kill_user_from_child(uid)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _wait_while_kfbot_lives(child: int, uid: int, kfbot: int) -> int:
    """The command's wait status. No namespace ends with kfbot here: should kfbot die
    first (killed outright, so no exit handler of its own runs), every process of the
    uid is killed then."""
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            return status
        if os.getppid() != kfbot:  # re-parented: kfbot is gone
            _kill_user_from_child(uid)
            return os.waitpid(child, 0)[1]
        signal.sigtimedwait({signal.SIGCHLD}, _ORPHAN_CHECK_S)


def _kill_user_from_child(uid: int) -> None:
    killer = os.fork()
    if killer == 0:
        kill_user(uid)
        os._exit(0)
    os.waitpid(killer, 0)


def become(uid: int, gid: int) -> None:
    """Take `uid` and `gid` for good, with no other group and no way to gain privileges
    (a set-user-ID program runs as the caller)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _os_error("prctl(PR_SET_NO_NEW_PRIVS)")


def kill_user(uid: int) -> None:
    """As `uid`, signal every process it may (all of that uid) until none is left alive.
    `kill(-1)` spares the caller; zombies are left to whoever reaps them."""
    become(uid, uid)
    me = os.getpid()
    for _ in range(_KILL_ROUNDS):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not _alive(uid, me):
            return
        time.sleep(0.01)


def _alive(uid: int, me: int) -> bool:
    """Whether a process of `uid` other than `me` is still running (not a zombie)."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/status", encoding="utf-8", errors="replace") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1 -1").split()[0]) == uid and \
                not fields.get("State", "").strip().startswith(("Z", "X")):
            return True
    return False


# ---- the mounts (unshare mode) ----------------------------------------------------------


def build_namespace(spec: dict[str, Any]) -> None:
    hidden = tuple(spec["hide"])
    covered = ("/proc", "/dev", *hidden)
    mounts = [m for m in mount_points() if not _under(m, covered)]
    # Opened before anything covers them: /tmp's folders, the device nodes.
    binds = [(path, mode, _open_path(path)) for path, mode in spec["binds"]]
    devices = [(path, fd) for path in _device_paths(spec["devices"])
               if (fd := _open_device(path)) is not None]
    mount_proc()
    for point in mounts:
        try:
            remount(point, read_only=True)
        except SetupError:
            # A kernel file system under /sys that this namespace may not remount: what
            # it holds is the kernel's, writable (if at all) with capabilities the
            # command does not have. Anything else left writable is a failure.
            if not point.startswith("/sys/"):
                raise
    mount_dev(devices, int(spec["shm_bytes"]))
    for root in hidden:
        size = int(spec["tmp_bytes"]) if root == "/tmp" else 1 << 20
        _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    for path, mode, fd in binds:
        bind(fd, path, read_only=mode == "ro")
        os.close(fd)


def mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            points.append(_unescape(line.split()[4]))
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def mount_proc() -> None:
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    for name in _PROC_READ_ONLY:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC, None)
            remount(path, read_only=True)


def mount_dev(devices: list[tuple[str, int]], shm_bytes: int) -> None:
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "size=1m,mode=755")
    for path, fd in devices:  # a node, or a folder of them (/dev/nvidia-caps)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        bind(fd, path, read_only=False)
        os.close(fd)
    os.makedirs("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_bytes},mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")


def bind(fd: int, path: str, read_only: bool) -> None:
    """Bind what `fd` holds onto `path` (made first where a tmpfs covers it)."""
    if not os.path.lexists(path):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "ab").close()
    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
    remount(path, read_only)


def remount(point: str, read_only: bool) -> None:
    try:
        kept = os.statvfs(point).f_flag & _KEPT_FLAGS
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
            return  # a mount under a path this process cannot reach is out of reach inside
        raise
    flags = MS_BIND | MS_REMOUNT | kept | (MS_RDONLY if read_only else 0)
    _mount(None, point, None, flags, None)


def _device_paths(wanted: list[str]) -> list[str]:
    return [p for p in (*(f"/dev/{n}" for n in _DEVICES), *wanted) if os.path.exists(p)]


def _open_device(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # gone since it was listed (a GPU reset): the command does without


def _open_path(path: str) -> int:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise SetupError(f"cannot open {path}: {exc.strerror}") from None


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None) -> None:
    args = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    if _libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
        what = f"mount {fstype or 'bind'} on {target}"
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _os_error(what: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{what}: {os.strerror(number)}")


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


if __name__ == "__main__":
    main(sys.argv)
