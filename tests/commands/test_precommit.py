"""`pre-commit run` with kfbot's light hook, in a temporary git repository.

The hook is the `kfbot-check` entry of `.pre-commit-hooks.yaml` as it ships (name,
always run, no file names, serial, not verbose), run by a real pre-commit. Only how it
is installed differs: `language: python` would have pre-commit build an environment
from PyPI, so the entry runs this environment's kfbot (`language: system`) instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXTRA = ("#include <torch/extension.h>\n"
         "__global__ void extra_kernel(float* x) { x[0] = 1; }\n"
         "void extra(torch::Tensor t) { extra_kernel<<<1, 1>>>(t.data_ptr<float>()); }\n")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "fixtures" / "example", root)
    (root / "csrc" / "extra.cu").write_text(EXTRA)
    (hook,) = [h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
               if h["id"] == "kfbot-check"]
    entry = hook["entry"].split()
    assert entry[:2] == ["kfbot", "check"]
    hook.update(language="system", entry=" ".join([sys.executable, "-m", "kfbot", *entry[1:]]))
    (root / ".pre-commit-config.yaml").write_text(yaml.safe_dump(
        {"repos": [{"repo": "local", "hooks": [hook]}]}))
    repo = git.Repo.init(root)
    repo.git.add("-A")
    repo.git.commit("-m", "initial", author="Dev <dev@example.com>",
                    env={"GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.com"})
    return root


def pre_commit(root: Path, tmp_path: Path, stage: bool = True
               ) -> subprocess.CompletedProcess[str]:
    if stage:
        git.Repo(root).git.add("-A")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
           "KFBOT_CACHE": str(tmp_path / "cache"), "PRE_COMMIT_COLOR": "never"}
    return subprocess.run([sys.executable, "-m", "pre_commit", "run"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_syntax_error_in_a_torch_header_file_fails_the_commit(repository: Path,
                                                                tmp_path: Path) -> None:
    kernel = repository / "csrc" / "extra.cu"
    kernel.write_text(EXTRA.replace("x[0] = 1;", "x[0] = 2;"))
    passed = pre_commit(repository, tmp_path)
    assert passed.returncode == 0, passed.stdout
    # Silent on a pass: pre-commit's status line and nothing else.
    assert passed.stdout.splitlines() == [f"kfbot-check{'.' * 62}Passed"], passed.stdout
    kernel.write_text(EXTRA.replace("x[0] = 1;", "x[0] = 2"))
    failed = pre_commit(repository, tmp_path)
    assert failed.returncode == 1, failed.stdout
    lines = failed.stdout.splitlines()
    assert any(line.startswith("kfbot-check") and line.endswith("Failed") for line in lines)
    assert "csrc/extra.cu:2: error: missing `;` (found by tree-sitter)" in lines
    status = next(line for line in lines if line.startswith("kfbot-check"))
    assert len(status) <= 79  # pre-commit pads to 79 columns with a short name


def test_a_staged_deletion_of_a_reference_test_fails_the_commit(repository: Path,
                                                               tmp_path: Path) -> None:
    repo = git.Repo(repository)
    repo.index.remove(["tests/test_ops.py"], working_tree=True)
    setup = repository / "csrc" / "bindings.cpp"  # an edit beside it, as people commit
    setup.write_text("// bindings\n" + setup.read_text())
    repo.index.add(["csrc/bindings.cpp"])
    failed = pre_commit(repository, tmp_path, stage=False)
    assert failed.returncode == 1, failed.stdout
    assert "csrc/softmax.cu:8: softmax_kernel: no reference test reaches it any more (at " \
           "HEAD: tests/test_ops.py:13 test_softmax)" in failed.stdout.splitlines()


def test_a_commit_without_kernel_sources_passes_quietly(repository: Path,
                                                       tmp_path: Path) -> None:
    (repository / "README.md").write_text("more words\n")
    passed = pre_commit(repository, tmp_path)
    assert passed.returncode == 0, passed.stdout
    assert passed.stdout.splitlines() == [f"kfbot-check{'.' * 62}Passed"], passed.stdout
