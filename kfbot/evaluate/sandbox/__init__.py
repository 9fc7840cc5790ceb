"""Where untrusted code runs: candidates, the repository's tests, scripts and builds.

Each such process gets two things. An allowlisted environment (`environment`): no
secret reaches it by a variable. And a sandbox (`methods`, `view`, `policy`): its own PID
and mount namespaces, made by bubblewrap or by `unshare` with a user namespace, in which

- the whole file system is read-only, except the folders the spawn point names as
  written (a scratch copy of the repository, a capture's output folder, a build's
  output folder) and kfbot's scratch home; kfbot's interpreter and package, the runner's
  tool cache and every `.git` stay read-only even inside those;
- /tmp, /run and /dev/shm are private and size-capped, /dev holds only the usual
  character devices and the GPU's, and any one file is capped in size;
- /proc is the namespace's own: kfbot's processes, their environments and memory cannot
  be seen, and nothing can be signalled outside;
- when the command ends, is killed or kfbot dies, the namespace ends and the kernel kills
  every process left in it, `setsid` daemons included.

    argv = confined(argv, cwd=copy, writable=[copy, out])   # then Popen(argv, ...)
    status = exit_code(proc.returncode)

`launch` is the program that finishes the set-up inside; `processes` runs one of the
repository's processes there and brings back how it ended. `credentials` is the other
side of the same boundary: the secrets kfbot's own process holds, read once at start
and kept out of every environment it passes on.

It imports only the ground floor: every other part of kfbot that runs untrusted
code comes through it.
"""

from kfbot.evaluate.sandbox.environment import (
    allowed,
    is_secret_name,
    python_module,
    scratch_home,
    scratch_root,
    untrusted_env,
)
from kfbot.evaluate.sandbox.methods import Attempt, Sandbox, detect
from kfbot.evaluate.sandbox.policy import (
    ALLOW_VARIABLE,
    allowed_unsandboxed,
    configure,
    confined,
    exit_code,
    held_secrets,
    sandbox,
)
from kfbot.evaluate.sandbox.view import View

__all__ = [
    "ALLOW_VARIABLE", "Attempt", "Sandbox", "View", "allowed", "allowed_unsandboxed",
    "configure", "confined", "detect", "exit_code", "held_secrets", "is_secret_name",
    "python_module", "sandbox", "scratch_home", "scratch_root", "untrusted_env",
]
