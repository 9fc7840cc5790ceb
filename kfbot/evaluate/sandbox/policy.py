"""Whether untrusted code may run here, and how: the one place every spawn point asks.

The sandbox is found once per kfbot process. Where none works, kfbot refuses to run
untrusted code while it holds a secret (a token, a key: anything the untrusted code could
read out of it), unless the person running it allowed that in so many words
(`--allow-unsandboxed`, `KFBOT_ALLOW_UNSANDBOXED=1`, `sandbox.allow_unsandboxed: true`).
Without a secret it runs unsandboxed and says so once: a developer's own machine, their
own repository.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from kfbot.errors import EXIT_MISSING_TOOL, EXIT_USAGE, KfbotError
from kfbot.evaluate.sandbox.environment import is_secret_name
from kfbot.evaluate.sandbox.methods import Sandbox, detect
from kfbot.evaluate.sandbox.view import View

ALLOW_VARIABLE = "KFBOT_ALLOW_UNSANDBOXED"
_TRUE = frozenset({"1", "true", "yes", "on"})

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_found: Sandbox | None = None
_allowed = False
_secrets: tuple[str, ...] | None = None
_noted = False
_before_first: Callable[[], None] | None = None


def configure(allow_unsandboxed: bool, secrets: Iterable[str],
              before_first: Callable[[], None] | None = None) -> None:
    """What the command was told (`allow_unsandboxed`), the names of the secrets this
    process holds (from the environment it started with, before it shed them), and what
    to do once before the first untrusted process starts."""
    global _allowed, _secrets, _before_first
    _allowed = allow_unsandboxed
    _secrets = tuple(sorted(secrets))
    _before_first = before_first


def held_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    """The variables of `env` that hold a secret: named like one, and with a value that is
    not the path of something on disk (`SSH_AUTH_SOCK`, `XAUTHORITY` say where a secret
    is, which a sandbox hides or unsandboxed code can reach anyway)."""
    return tuple(sorted(name for name, value in env.items() if is_secret_name(name)
                        and value.strip() and not _names_a_path(value)))


def _names_a_path(value: str) -> bool:
    return value.startswith("/") and os.path.exists(value)


def sandbox() -> Sandbox:
    """The sandbox of this machine, found on first use. Raises KfbotError where
    `KFBOT_SANDBOX` names no method."""
    global _found
    with _lock:
        if _found is None:
            try:
                _found = detect()
            except ValueError as exc:
                raise KfbotError(str(exc), EXIT_USAGE) from None
        return _found


def confined(argv: Sequence[str], cwd: str | Path, writable: Iterable[str | Path] = (),
             readable: Iterable[str | Path] = (),
             env: Mapping[str, str] | None = None) -> list[str]:
    """`argv` as it must run: in the sandbox, seeing `cwd` and `readable` and writing only
    `writable` (and its private /tmp and home); `env` is the environment it will get, in
    which paths it is handed are found. Raises KfbotError where there is no sandbox and a
    secret is held, unless that was allowed."""
    box = sandbox()
    _first_run()
    if not box.available:
        _unconfined(box)
        return list(argv)
    return box.command(argv, View.of(cwd, writable, readable, argv, env))


def finished(argv: Sequence[str]) -> None:
    """Call once the command `confined` made has ended or been killed (and reaped):
    whatever it left running is killed, where the sandbox does not do that itself."""
    sandbox().finished(argv)


def exit_code(code: int) -> int:
    """The confined command's own exit status (negative: the signal that killed it)."""
    return sandbox().exit_code(code)


def allowed_unsandboxed() -> bool:
    return _allowed or os.environ.get(ALLOW_VARIABLE, "").strip().lower() in _TRUE


def refusal(box: Sandbox, secrets: Sequence[str]) -> str:
    """Why kfbot will not run the repository's code here, and what fixes it."""
    tried = "; ".join(a.line() for a in box.failed)
    return (f"kfbot will not run the repository's code or candidates outside a sandbox "
            f"while it holds secrets ({', '.join(secrets)}): the code could take them (from "
            f"kfbot's memory, or through files kfbot runs later). Tried: {tried}. To fix: "
            f"{box.advice()}. To run unsandboxed anyway, knowing the code can take those "
            f"secrets: --allow-unsandboxed or {ALLOW_VARIABLE}=1 (in the Action, the input "
            "`allow-unsandboxed: true`; on the command line also `sandbox: "
            "{allow_unsandboxed: true}` in kfbot.yaml); see docs/security.md")


def _first_run() -> None:
    global _before_first
    with _lock:
        todo, _before_first = _before_first, None
        if todo is not None:
            todo()


def _unconfined(box: Sandbox) -> None:
    global _noted
    secrets = _secrets if _secrets is not None else held_secrets(os.environ)
    if secrets and not allowed_unsandboxed():
        raise KfbotError(refusal(box, secrets), EXIT_MISSING_TOOL)
    with _lock:
        if _noted:
            return
        _noted = True
    held = f"; it holds {', '.join(secrets)} (allowed)" if secrets else ""
    _log.warning("running the repository's code without a sandbox (%s)%s; %s",
                 "; ".join(a.line() for a in box.failed), held, box.advice())
