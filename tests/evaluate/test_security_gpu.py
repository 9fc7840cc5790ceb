"""On a GPU, through the real commands: the repository's tests run as children of kfbot
and look for its secrets, in its environment and their own; and the sandbox changes no
figure (the original timed sandboxed and unsandboxed on one machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_sandbox_attacks import _path_without

from kfbot.evaluate.sandbox import ALLOW_VARIABLE, held_secrets

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example"
SECRETS = {"INPUT_TOKEN": "ghs_gpuTestToken0123456789", "ANTHROPIC_API_KEY": "sk-ant-gpu-0123",
           "GH_PAT": "ghp_gpuPat0123456789", "CI_JOB_JWT": "eyJgpujwt0123456789",
           "GIT_CONFIG_VALUE_0": "AUTHORIZATION: basic Z3B1dGVzdA=="}
NOTE = "running the repository's code without a sandbox"

# Prepended to the repository's test file: what it finds is said in the error that stops
# its collection, which `kfbot verify --explain` shows (in the sandbox it can leave no
# file behind). It reads its own environment and every process's it may read (its
# parent's among them, where it is allowed), and says how many secrets it saw, never
# which, and how many processes it could read.
TEST_SPY = '''
import os
_secrets = {secrets!r}
_seen, _read = repr(dict(os.environ)), 0
for _pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        _seen += open(f"/proc/{{_pid}}/environ", "rb").read().decode(errors="replace")
        _read += 1
    except OSError:
        pass
_found = [s for s in _secrets if s in _seen]
raise AssertionError(f"SPY-FOUND {{len(_found)}} READ {{_read}} HOME={{os.environ.get('HOME')}}")
'''


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the module: the torch-headers binding is compiled once."""
    kept = os.environ.get("KFBOT_TEST_CACHE")
    return Path(kept) if kept else tmp_path_factory.mktemp("cache")


def _copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def test_the_repositorys_tests_find_no_secret_of_kfbot(tmp_path: Path, cache: Path) -> None:
    repo = _copy(tmp_path)
    test_file = repo / "tests" / "test_ops.py"
    test_file.write_text(TEST_SPY.format(secrets=list(SECRETS.values())) + test_file.read_text())
    env = {**os.environ, **SECRETS, "KFBOT_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "saxpy_kernel", "--repo",
                           str(repo), "--explain"], env=env, capture_output=True, text=True,
                          timeout=900)
    said = done.stdout + done.stderr
    print(said[-3000:])
    found = re.search(r"SPY-FOUND (\d+) READ (\d+) HOME=", said)
    assert found is not None, "the repository's tests never ran"
    assert found[1] == "0" and int(found[2]) >= 1, found[0]  # its own environ at least
    assert f"HOME={os.environ.get('HOME')}\n" not in said  # a scratch home
    for value in SECRETS.values():
        assert value not in said


def _bench(repo: Path, path: str, cache: Path) -> tuple[dict[str, Any], str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in {*held_secrets(os.environ), ALLOW_VARIABLE}}
    done = subprocess.run([sys.executable, "-m", "kfbot", "bench", "softmax_kernel", "--repo",
                           str(repo), "--json"], env={**clean, "PATH": path,
                                                      "KFBOT_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout)
    return found, done.stderr


def test_the_sandbox_changes_no_figure(tmp_path: Path, cache: Path) -> None:
    """`kfbot bench` (the original against a copy of itself) without a namespace, then in
    one, on one cache: the same shapes, the same verdicts, the original's times alike.
    Without bwrap and unshare, kfbot as a user runs unsandboxed (and says so); as root it
    lends the commands a separate user id, a sandbox without a namespace."""
    repo = _copy(tmp_path)
    bare = _path_without(tmp_path / "bin", {"bwrap", "unshare"})  # a runner with neither
    plain, plain_err = _bench(repo, bare, cache)
    boxed, boxed_err = _bench(repo, os.environ["PATH"], cache)
    assert (NOTE in plain_err) == (os.geteuid() != 0), plain_err[-2000:]
    assert NOTE not in boxed_err, boxed_err[-2000:]
    rows = list(zip(plain["timings"], boxed["timings"], strict=True))
    first = "unsandboxed us" if os.geteuid() != 0 else "separate id us"
    print(f"\n{'input':32} {first:>15} {'namespace us':>13} {'ratio':>6}")
    for a, b in rows:
        ratio = b["original_median_us"] / a["original_median_us"]
        print(f"{str(a['input'])[:32]:32} {a['original_median_us']:15.2f} "
              f"{b['original_median_us']:13.2f} {ratio:6.3f}")
    assert [a["input"] for a, _ in rows] == [b["input"] for _, b in rows]
    assert plain["ok"] and boxed["ok"]
    for a, b in rows:
        assert 0.8 < b["original_median_us"] / a["original_median_us"] < 1.25
