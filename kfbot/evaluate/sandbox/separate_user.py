"""The sandbox of last resort when kfbot runs as root: the untrusted command runs as a
uid of its own, in a group of kfbot's process, which no other process uses and no file of
kfbot's belongs to.

Where neither bubblewrap nor user namespaces work (a container whose seccomp profile
refuses `unshare`), root can still give the command a user that owns nothing. Each command
gets a fresh id from a high range (no passwd entry needed), no supplementary groups,
`PR_SET_NO_NEW_PRIVS`, the per-file size cap, and a private `HOME` and `TMPDIR` owned by
that id. The folders the spawn point names as written (kfbot's own scratch copies and
output folders) are made writable by the group, but for any `.git` and kfbot's own files
inside them, which stay root's and read-only. Everything else it can write is what any
user can: the shared /tmp, /dev/shm.

It does not hide kfbot's processes (there is no PID namespace): their environments and
memory are root's, which the id cannot open, and it cannot signal them. When the command
ends, is killed, or kfbot exits, every process of that id is killed by a process that
takes the id itself and signals all it may (`kill(-1)`): `setsid` daemons included.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import kfbot
from kfbot.evaluate.sandbox.environment import scratch_home, scratch_root
from kfbot.evaluate.sandbox.view import View

METHOD = "separate-user"
# Ids are drawn from here (cut to what this user namespace maps): far above any system
# or login user, so that no file on the machine belongs to one.
FIRST_ID = 1_500_000_000
LAST_ID = 1_999_999_999
_LOW_FALLBACK = 100_000  # the floor when a container maps fewer ids
_TRIES = 64
_KILL_TIMEOUT_S = 60.0
_SHARED = ("/tmp", "/var/tmp", "/dev/shm")  # what any user may write
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LAUNCHER = str(Path(__file__).resolve().with_name("launch.py"))  # its "kill" mode

_lock = threading.Lock()
_leases: dict[int, Lease] = {}
# Folders given search permission: (original mode, device, inode), so that the mode goes
# back to that folder only, whatever a command has put at its path since.
_opened: dict[str, tuple[int, int, int]] = {}
_registered = False
_group: int | None = None


@dataclass(frozen=True)
class Lease:
    """An id lent to one command, and the private folders made for it."""

    uid: int
    gid: int  # shared by the commands of this kfbot process: they share written folders
    folder: str  # holds its home and tmp; removed on release

    @property
    def home(self) -> str:
        return os.path.join(self.folder, "home")

    @property
    def tmp(self) -> str:
        return os.path.join(self.folder, "tmp")


# ---- whether it can be used ----------------------------------------------------------------


def problem() -> str | None:
    """Why this method cannot be used here, or None."""
    if os.geteuid() != 0:
        return "kfbot is not root"
    if not _free_ranges():
        return "this user namespace maps no id above the system users"
    for path in _kfbot_folders():
        found = _writable_by_others(path) or (
            _writable_inside(path) if path in _installed() else None)
        if found is not None:
            return (f"{found} is writable by group or others: the command could rewrite "
                    f"kfbot's interpreter or packages (chmod go-w {found})")
    for path in _kept_folders():
        found = _writable_by_others(path)
        if found is not None:
            return (f"{found} is writable by group or others: the command could change "
                    f"what kfbot runs or pushes (chmod go-w {found})")
    return None


def _kept_folders() -> list[str]:
    """The runner's tool cache and the checkout's `.git`: read-only in every sandbox."""
    workspace = os.environ.get("GITHUB_WORKSPACE", "")
    found = [os.environ.get("RUNNER_TOOL_CACHE", ""),
             os.path.join(workspace, ".git") if workspace else "",
             os.path.join(workspace, ".git", "config") if workspace else ""]
    return [p for p in found if p and os.path.exists(p)]


def _installed() -> set[str]:
    """kfbot's package and virtual environment, looked at all the way down; not the
    interpreter's own prefix, which may be /usr."""
    package = str(Path(kfbot.__file__).resolve().parent)
    return {package, sys.prefix} if sys.prefix != sys.base_prefix else {package}


def _writable_inside(top: str) -> str | None:
    """A folder below `top` that another user could change, if any: one would add a
    module or a `.pth` file there that kfbot imports. Only folders are looked at: a
    venv with torch holds some 4,000 (0.3 s on a busy 2-core machine) and 47,000 files,
    which would double that, and pip writes no file others may change."""
    for folder, _, _ in os.walk(top):
        if _open_to_others(os.stat(folder)):
            return folder
    return None


def _kfbot_folders() -> list[str]:
    package = Path(kfbot.__file__).resolve().parent
    here = os.path.dirname(os.path.realpath(sys.executable))
    return sorted({sys.prefix, sys.base_prefix, here, str(package)})


def _writable_by_others(path: str) -> str | None:
    """The folder of `path` or above it that another user could change, if any. A sticky
    folder (/tmp) counts only for what it holds directly, which is checked separately;
    group-writable counts unless the group is root's."""
    current = Path(path).resolve()
    for folder in (current, *current.parents):
        try:
            info = folder.stat()
        except OSError:
            continue
        if _open_to_others(info):
            return str(folder)
    return None


def _open_to_others(info: os.stat_result) -> bool:
    world = info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX
    group = info.st_mode & stat.S_IWGRP and info.st_gid != 0
    return bool(world or group)


# ---- lending an id -------------------------------------------------------------------------


def lease(view: View) -> Lease:
    """A fresh id for one command that sees `view`, its folders ready."""
    global _registered, _group
    with _lock:
        if not _registered:
            atexit.register(release_all)
            _registered = True
        if _group is None:
            _group = _free_id()
        uid = _free_id()
        lent = Lease(uid, _group, os.path.join(scratch_root(), "users", str(uid)))
        _leases[uid] = lent
    for folder in (lent.home, lent.tmp):
        os.makedirs(folder, mode=0o700)
        os.chown(folder, uid, lent.gid)
    _hand_over(view, lent.gid)
    # kfbot's interpreter and packages too: the command may be kfbot's own worker.
    _open_way([lent.folder, view.cwd, *(path for path, _ in view.binds),
               *_kfbot_folders(), *(p for p in sys.path if p)])
    return lent


def spec(lent: Lease, view: View, file_bytes: int) -> dict[str, object]:
    """What the launcher needs to start the command as the lent id."""
    return {"mode": METHOD, "uid": lent.uid, "gid": lent.gid, "umask": 0o002, "cwd": view.cwd,
            "parent": os.getpid(), "file_bytes": file_bytes,
            # The lent id has no passwd entry: `getpass.getuser()` (torch's extension
            # and compile caches ask it) reads these before it would ask for one.
            "env": {"HOME": lent.home, "TMPDIR": lent.tmp, "USER": f"kfbot{lent.uid}",
                    "LOGNAME": f"kfbot{lent.uid}"}}


def _free_id() -> int:
    ranges = _free_ranges()
    taken = set(_leases) | {_group} | _ids_in_use()
    for _ in range(_TRIES):
        low, high = random.choice(ranges)
        uid = random.randint(low, high)
        if uid not in taken and not _has_passwd_entry(uid):
            return uid
    raise OSError(f"found no unused id in {ranges} after {_TRIES} tries")


def _free_ranges() -> list[tuple[int, int]]:
    """Ranges of ids mapped as uid and as gid in this user namespace, high ones first."""
    both = _intersect(_mapped("/proc/self/uid_map"), _mapped("/proc/self/gid_map"))
    high = _intersect(both, [(FIRST_ID, LAST_ID)])
    return high or [r for r in _intersect(both, [(_LOW_FALLBACK, 65_533)]) if r[1] > r[0]]


def _mapped(path: str) -> list[tuple[int, int]]:
    try:
        with open(path, encoding="ascii") as f:
            rows = [line.split() for line in f if line.strip()]
    except OSError:
        return [(0, 4_294_967_294)]
    return [(int(inside), int(inside) + int(count) - 1) for inside, _, count in rows]


def _intersect(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]
               ) -> list[tuple[int, int]]:
    out = [(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b]
    return [r for r in out if r[0] <= r[1]]


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _ids_in_use() -> set[int]:
    """Every uid (real, effective, saved, file system) of a process here."""
    found: set[int] = set()
    for status in _statuses():
        found.update(int(x) for x in status.get("Uid", "").split())
        found.update(int(x) for x in status.get("Gid", "").split())
    return found


def _runs_as(uid: int) -> bool:
    """Whether a process here has `uid` (a zombie counts: it is cheap to be sure)."""
    return any(str(uid) in status.get("Uid", "").split() for status in _statuses())


def _statuses() -> Iterator[dict[str, str]]:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="utf-8", errors="replace") as f:
                yield dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue  # it ended


def _hand_over(view: View, gid: int) -> None:
    """Make the view's written folders writable by the commands' group, but for what
    stays read-only in them (every `.git`, kfbot's own files) and kfbot's shared scratch
    home. Root keeps owning them: the group is shared by the commands running at once
    (a candidate's worker writes where the judge's reads), and no command can chmod what
    another made writable. A command running meanwhile may swap a file for a link: the
    walk goes by folder descriptors and changes only what it opened without following
    one."""
    kept = {path for path, mode in view.binds if mode == "ro"} | {scratch_home()}
    for top in view.writable():
        if top in kept:
            continue
        for folder, dirs, files, fd in os.fwalk(top):
            guarded = [d for d in (*dirs, *files)
                       if d == ".git" or os.path.join(folder, d) in kept]
            dirs[:] = [d for d in dirs if d not in guarded]
            # Sticky where something must stay: a command removes or renames only its own
            # files there, so it cannot move `.git` away and put its own in its place.
            _share(fd, gid, stat.S_IRWXG | stat.S_ISGID | (stat.S_ISVTX if guarded else 0))
            for name in files:
                if name not in guarded:
                    _give(name, fd, gid)


def _share(fd: int, gid: int, bits: int) -> None:
    os.fchown(fd, 0, gid)
    os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | bits)


def _give(name: str, folder_fd: int, gid: int) -> None:
    """Share one regular file; a link, a FIFO or a file gone meanwhile is left alone."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder_fd)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        # A second link to a file elsewhere (a copy made with hard links) stays as it is:
        # the group would get the other name too.
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            executable = stat.S_IXGRP if info.st_mode & stat.S_IXUSR else 0
            _share(fd, gid, stat.S_IRGRP | stat.S_IWGRP | executable)
    finally:
        os.close(fd)


def _open_way(paths: Sequence[str]) -> None:
    """Give others search permission (never read) on each of `paths` (a folder) and the
    folders above it that lack it, so that the id reaches them; the modes are restored
    when kfbot exits. A link is resolved first, then the walk down from `/` goes by
    descriptors and stops at a link (one a running command has just put there)."""
    for path in {os.path.realpath(p) for p in paths}:
        try:
            _open_down(path)
        except OSError:
            continue  # not a folder, or gone: the command says what it cannot open


def _open_down(path: str) -> None:
    for fd, here in _walk_down(path):
        _open_one(fd, here)


def _walk_down(path: str) -> Iterator[tuple[int, str]]:
    """A descriptor of each folder from `/` down to `path`, with its path, opened without
    following a link: the walk ends (OSError) where a command has put one."""
    fd = os.open("/", _FOLDER)
    try:
        here = Path("/")
        for part in Path(path).parts[1:]:
            child = os.open(part, _FOLDER, dir_fd=fd)
            os.close(fd)
            fd, here = child, here / part
            yield fd, str(here)
    finally:
        os.close(fd)


def _open_one(fd: int, path: str) -> None:
    with _lock:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if path in _opened or mode & stat.S_IXOTH:
            return
        _opened[path] = (mode, info.st_dev, info.st_ino)
        os.fchmod(fd, mode | stat.S_IXOTH)


def _close_again(path: str, mode: int, device: int, inode: int) -> None:
    """Give `path` its mode back, if it still is the folder that was opened."""
    try:
        for fd, here in _walk_down(path):
            info = os.fstat(fd)
            if here == path and (info.st_dev, info.st_ino) == (device, inode):
                os.fchmod(fd, mode)
    except OSError:
        return  # removed meanwhile, or a link now


# ---- taking it back ------------------------------------------------------------------------


def lease_of(argv: Sequence[str]) -> int | None:
    """The id a confined command runs as, read back from its launcher's arguments."""
    for arg in argv[:6]:
        if arg.startswith("{") and f'"mode": "{METHOD}"' in arg:
            uid = json.loads(arg).get("uid")
            return uid if isinstance(uid, int) else None
    return None


def release(uid: int) -> None:
    """Kill every process of `uid`, remove its private folders, and forget it."""
    if _runs_as(uid):  # mostly not: the launcher kills what is left when the command ends
        kill_all(uid)
    with _lock:
        lent = _leases.pop(uid, None)
    if lent is not None:
        shutil.rmtree(lent.folder, ignore_errors=True)
        _sweep(uid)


def _sweep(uid: int) -> None:
    """Remove what `uid` left in the folders every user may write: no process of it runs
    any more and nobody else has it, so nothing there of that id is anyone's. Left, it
    would fill the disk (or memory, in /dev/shm) and wait for the next job."""
    for shared in _SHARED:
        try:
            entries = list(os.scandir(shared))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)  # by descriptors: follows no link inside
                else:
                    os.unlink(entry.path)


def release_all() -> None:
    """At exit: nothing lent outlives kfbot, and the folders opened get their modes back."""
    for uid in list(_leases):
        release(uid)
    with _lock:
        opened = sorted(_opened.items(), reverse=True)
        _opened.clear()
    for folder, (mode, device, inode) in opened:
        _close_again(folder, mode, device, inode)


def kill_all(uid: int) -> None:
    """Kill every process of `uid`, from a process that takes that id (root's `kill(-1)`
    would kill everything)."""
    order = json.dumps({"mode": "kill", "uid": uid})
    subprocess.run([sys.executable, "-I", "-S", _LAUNCHER, order], stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=_KILL_TIMEOUT_S, check=False)
