"""The environment of every process that runs untrusted code.

Candidates, the repository's tests, its scripts and its builds (a `setup.py` is a
program) are untrusted. They get an allowlisted environment: what finds the compiler,
CUDA, torch and the locale, and nothing else; `HOME` is a scratch folder, so that
nothing reads the user's dot-files (git credentials, `~/.netrc`, cloud keys) through it.
A denylist of secret-looking names cannot work: credentials live under names such as
`GH_PAT`, `CI_JOB_JWT`, `GIT_CONFIG_VALUE_0` or inside `PIP_INDEX_URL`. Names that look
like secrets are still dropped from what the allowlist lets through, as a second layer.

The process that starts these must not hold secrets in its own environment either (a
child can read `/proc/<parent>/environ`): see `kfbot.evaluate.sandbox.credentials`.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from collections.abc import Mapping

_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "SHELL", "USER", "LOGNAME",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
    "PKG_CONFIG_PATH", "CC", "CXX", "CUDAHOSTCXX", "CUDACXX", "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS", "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH",
    "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "SOURCE_DATE_EPOCH",
    # The runner finds what a job left running by this variable: the children keep it.
    "RUNNER_TRACKING_ID",
})
_PREFIXES = ("LC_", "CUDA", "NVIDIA_", "CUDNN_", "NCCL_", "NVSHMEM_", "TORCH_", "PYTORCH_",
             "TRITON_", "CUBLAS_", "CUPTI_", "KFBOT_")
_SECRET_NAME = re.compile(r"token|key|secret|password|passwd|credential|auth|cookie|jwt|pat$",
                          re.IGNORECASE)

_scratch_root: str | None = None


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name suggests it holds a credential."""
    return _SECRET_NAME.search(name) is not None


def allowed(name: str) -> bool:
    """Whether untrusted code may see the variable `name` (its value is not looked at)."""
    return (name in _NAMES or name.startswith(_PREFIXES)) and not is_secret_name(name)


def untrusted_env(extra: Mapping[str, str] | None = None,
                  base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted part of `base` (default: this process's environment) plus `extra`.

    `extra` is what kfbot itself hands the process (a GPU index, a capture request); it
    is filtered by name like the rest, since a credential has no business there.
    """
    source = os.environ if base is None else base
    env = {name: value for name, value in source.items() if allowed(name)}
    env["HOME"] = scratch_home()
    env.update({k: v for k, v in (extra or {}).items() if not is_secret_name(k)})
    return env


def scratch_root() -> str:
    """A private folder of this kfbot process, removed at exit: its children's home, and
    the scratch folders they read. A sandbox shows it (see `kfbot.evaluate.sandbox`) where
    it hides the rest of /tmp."""
    global _scratch_root
    if _scratch_root is None or not os.path.isdir(_scratch_root):
        _scratch_root = tempfile.mkdtemp(prefix="kfbot-scratch-")
        atexit.register(shutil.rmtree, _scratch_root, True)
    return _scratch_root


def scratch_home() -> str:
    """A private, empty home folder for this kfbot process's children."""
    home = os.path.join(scratch_root(), "home")
    os.makedirs(home, exist_ok=True)
    return home


# `python -m` puts the working directory first on sys.path, where a repository's
# `kfbot/`, `torch.py` or `yaml.py` would be imported in place of the real ones. The
# bootstrap drops that entry before anything else is imported.
_BOOTSTRAP = ("import sys; del sys.path[0]; import runpy; "
              "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def python_module(python: str, module: str) -> list[str]:
    """The command that runs `module` as `python -m` would, but without the working
    directory on sys.path; arguments follow it."""
    return [python, "-c", _BOOTSTRAP.format(module=module)]
