"""Secrets kfbot holds: read once at start, then kept out of every environment.

A process can read the environment another process of the same user started with, in
`/proc/<pid>/environ`, and taking a variable out of `os.environ` later does not change
what that file shows. So the commands that run untrusted code (candidates, the
repository's tests and scripts) begin by re-executing themselves with a clean
environment: the kept variables below, nothing else. The whole original environment
travels to the new process through an inherited, unnamed file descriptor, is read into
memory, and the descriptor is closed; secrets are then handed to the code that needs
them (the GitHub client, the one `git push`, the Anthropic client) from memory.

What stays in the environment: the variables untrusted code may see anyway (see
`kfbot.evaluate.sandbox`), the runner's non-secret `GITHUB_*`/`RUNNER_*`/`INPUT_*`
variables, kfbot's own settings, where output goes, and proxies without a password.

The secrets are then in this process's memory only. The process is made not dumpable
(`prctl(PR_SET_DUMPABLE, 0)`): another process of the same user can neither attach to
it nor read its `/proc/<pid>/mem`, and its `/proc` files belong to root. And before the
first untrusted process starts, the modules the command will need later are imported
(`preload`), so that nothing it imports afterwards comes from files that code could
have changed.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence

from kfbot.evaluate.sandbox.environment import allowed, is_secret_name

CARRIER = "KFBOT_CARRIED_ENV_FD"
_KEPT_NAMES = frozenset({
    "HOME", "CI", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "COLUMNS", "LINES", "NO_COLOR",
    "FORCE_COLOR", "PYTHONIOENCODING", "PYTHONUNBUFFERED", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL", "ANTHROPIC_BASE_URL",
})
_KEPT_PREFIXES = ("GITHUB_", "RUNNER_", "INPUT_", "RAY_")
_PROXIES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"})

_original: dict[str, str] | None = None


def kept(name: str, value: str) -> bool:
    """Whether the variable stays in kfbot's own environment after the re-exec."""
    if is_secret_name(name):
        return False
    if name.upper() in _PROXIES:
        return not urllib.parse.urlsplit(value).password
    return allowed(name) or name in _KEPT_NAMES or name.startswith(_KEPT_PREFIXES)


def clean_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if kept(name, value)}


def protect(argv: Sequence[str] | None = None) -> None:
    """Re-execute this process with a clean environment, carrying the original along.

    Called first by the commands that run untrusted code. In the re-executed process it
    reads what was carried and returns; where nothing would be dropped it returns at once.
    """
    global _original
    if _original is not None:
        return
    fd = os.environ.pop(CARRIER, None)
    if fd is not None:
        _original = _receive(int(fd))
        not_dumpable()
        return
    clean = clean_environment(os.environ)
    if clean == dict(os.environ):
        _original = dict(os.environ)
        not_dumpable()
        return
    carried = _carrier(json.dumps(dict(os.environ)).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    command = list(argv) if argv is not None else [sys.executable, *sys.orig_argv[1:]]
    os.execve(command[0], command, {**clean, CARRIER: str(carried)})


def not_dumpable() -> None:
    """No core dump, no ptrace attach and no `/proc/<pid>/mem` for others of this user.
    Reset by every exec, so set in the process that holds the secrets."""
    pr_set_dumpable = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(number)}")


def preload(names: Sequence[str]) -> None:
    """Import `names` (a package with every module in it) that are installed."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        if name.startswith("kfbot.") and hasattr(module, "__path__"):
            for found in pkgutil.walk_packages(module.__path__, f"{name}."):
                importlib.import_module(found.name)


def _carrier(data: bytes) -> int:
    """An unnamed file holding `data`, open at offset 0 and inherited across exec."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("kfbot-env", 0)
    else:
        with tempfile.TemporaryFile() as handle:  # already unlinked
            fd = os.dup(handle.fileno())
    os.set_inheritable(fd, True)  # the new image reads it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _receive(fd: int) -> dict[str, str]:
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    found = json.loads(b"".join(chunks))
    return {str(k): str(v) for k, v in found.items()}


def original(name: str) -> str | None:
    """A variable of the environment kfbot was started with (secrets included)."""
    return (_original if _original is not None else os.environ).get(name)


def original_environment() -> dict[str, str]:
    return dict(_original if _original is not None else os.environ)

