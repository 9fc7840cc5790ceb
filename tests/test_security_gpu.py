"""On a GPU, through the real command: the repository's tests and a candidate's host code
run as children of kfbot and look for its secrets, in its environment and their own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example"
SECRETS = {"INPUT_TOKEN": "ghs_gpuTestToken0123456789", "ANTHROPIC_API_KEY": "sk-ant-gpu-0123",
           "GH_PAT": "ghp_gpuPat0123456789", "CI_JOB_JWT": "eyJgpujwt0123456789",
           "GIT_CONFIG_VALUE_0": "AUTHORIZATION: basic Z3B1dGVzdA=="}

TEST_SPY = '''
import json, os
_parent = open(f"/proc/{{os.getppid()}}/environ", "rb").read().decode(errors="replace")
with open({out!r}, "w") as _f:
    json.dump({{"parent": _parent, "own": dict(os.environ)}}, _f)
'''

CANDIDATE_SPY = r'''
#include <cstdio>
#include <unistd.h>
extern char** environ;
namespace {
struct Spy {
  Spy() {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/environ", (int)getppid());
    FILE* out = std::fopen("OUT", "wb");
    FILE* in = std::fopen(path, "rb");
    if (out && in) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) std::fwrite(buf, 1, n, out);
    }
    for (char** e = environ; out && *e; ++e) std::fprintf(out, "\n%s", *e);
    if (in) std::fclose(in);
    if (out) std::fclose(out);
  }
};
Spy spy;
}  // namespace
'''


def test_children_of_kfbot_find_no_secret(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    test_found, candidate_found = tmp_path / "test-spy.json", tmp_path / "candidate-spy.txt"
    test_file = repo / "tests" / "test_ops.py"
    test_file.write_text(TEST_SPY.format(out=str(test_found)) + test_file.read_text())
    candidate = tmp_path / "vector_add.cu"
    candidate.write_text(CANDIDATE_SPY.replace("OUT", str(candidate_found))
                         + (repo / "csrc" / "vector_add.cu").read_text())
    env = {**os.environ, **SECRETS, "KFBOT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "saxpy_kernel", "--repo",
                           str(repo), "--candidate", str(candidate)], env=env,
                          capture_output=True, text=True, timeout=900)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert test_found.is_file(), "the repository's tests never ran: nothing was shown"
    seen = test_found.read_text()
    if candidate_found.is_file():  # unless a static check refused to build it
        seen += candidate_found.read_text(errors="replace")
    for value in SECRETS.values():
        assert value not in seen
    found = json.loads(test_found.read_text())
    assert found["own"]["HOME"] != os.environ.get("HOME")  # a scratch home
