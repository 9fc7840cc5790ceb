"""What untrusted code may see of kfbot's environment, and what it may import first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kfbot.evaluate.sandbox import (
    View,
    allowed,
    held_secrets,
    python_module,
    scratch_home,
    untrusted_env,
)

LEAKY = {
    "GITHUB_TOKEN": "ghs_x", "GH_PAT": "ghp_x", "PIP_INDEX_URL": "https://u:pw@pypi.example",
    "CI_JOB_JWT": "eyJ", "GIT_CONFIG_VALUE_0": "AUTHORIZATION: basic eA==",
    "INPUT_TOKEN": "t", "INPUT_ANTHROPIC_API_KEY": "sk-ant", "AWS_PROFILE": "prod",
    "SSH_AUTH_SOCK": "/tmp/agent", "NETRC": "/root/.netrc", "DOCKER_CONFIG": "/d",
    "TORCH_HUB_TOKEN": "hub", "KFBOT_API_KEY": "k",
}
KEPT = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "CUDA_HOME": "/usr/local/cuda",
        "CUDA_VISIBLE_DEVICES": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "CXX": "g++",
        "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/lib64"}


def test_only_the_allowlist_passes() -> None:
    env = untrusted_env(base={**LEAKY, **KEPT, "HOME": "/root"})
    assert {k: env[k] for k in KEPT} == KEPT
    assert not set(LEAKY) & set(env)
    assert env["HOME"] == scratch_home() != "/root"
    assert os.listdir(env["HOME"]) == []


def test_extras_are_filtered_by_name_too() -> None:
    env = untrusted_env({"KFBOT_CAPTURE": "{}", "EXTRA_AUTH_HEADER": "x"}, base={})
    assert env["KFBOT_CAPTURE"] == "{}"
    assert "EXTRA_AUTH_HEADER" not in env


def test_secret_looking_names_are_dropped_even_under_an_allowed_prefix() -> None:
    assert allowed("CUDA_HOME") and allowed("LC_CTYPE")
    assert not allowed("TORCH_HUB_TOKEN") and not allowed("KFBOT_SECRET")
    assert not allowed("HOME")  # it is set, to the scratch folder, never passed through


def test_a_module_runs_without_the_working_directory_on_its_path(tmp_path: Path) -> None:
    """A repository's `json.py` and `kfbot/` must not replace the real ones."""
    planted = tmp_path / "planted.txt"
    for name in ("json.py", "kfbot/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f"open({str(planted)!r}, 'a').write({name!r})\n")
    (tmp_path / "probe_mod.py").write_text("")
    script = tmp_path / "out"
    script.mkdir()
    (script / "show_path.py").write_text(
        "import json, sys\nprint(json.dumps({'path': sys.path, 'argv': sys.argv[1:]}))\n")
    env = {**os.environ, "PYTHONPATH": str(script)}
    done = subprocess.run([*python_module(sys.executable, "show_path"), "--flag", "x"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout)
    assert not planted.exists()
    assert str(tmp_path) not in seen["path"] and "" not in seen["path"]
    assert seen["argv"] == ["--flag", "x"]


def test_kfbot_keeps_the_runner_variables_it_reads_and_no_secret() -> None:
    from kfbot.evaluate.sandbox.credentials import clean_environment

    env = {**LEAKY, **KEPT, "HOME": "/root", "GITHUB_REPOSITORY": "o/r",
           "GITHUB_EVENT_PATH": "/e.json", "RUNNER_TEMP": "/t", "INPUT_BUDGET": "64",
           "RAY_ADDRESS": "auto", "HTTPS_PROXY": "http://proxy:3128",
           "HTTP_PROXY": "http://user:pw@proxy:3128", "ACTIONS_RUNTIME_TOKEN": "rt"}
    clean = clean_environment(env)
    assert {"GITHUB_REPOSITORY", "GITHUB_EVENT_PATH", "RUNNER_TEMP", "INPUT_BUDGET",
            "RAY_ADDRESS", "HTTPS_PROXY", "HOME", *KEPT} <= set(clean)
    assert not {*LEAKY, "HTTP_PROXY", "ACTIONS_RUNTIME_TOKEN"} & set(clean)


def test_a_view_shows_what_it_is_given_and_never_a_whole_hidden_root(tmp_path: Path) -> None:
    writable, readable = tmp_path / "copy", tmp_path / "input"
    (writable / ".git").mkdir(parents=True)
    readable.mkdir()
    view = View.of(tmp_path, writable=[writable, "/tmp"], readable=[readable, "/tmp", "/"],
                   command=["sh", "-c", f"cat {readable}/x"], env={"TMPDIR": "/tmp"})
    binds = dict(view.binds)
    assert binds[str(writable)] == "rw" and binds[str(writable / ".git")] == "ro"
    assert binds[str(tmp_path)] == "ro" and binds[scratch_home()] == "rw"
    assert not {"/", "/tmp", "/run"} & set(binds)  # that would undo the private /tmp
    order = [path for path, _ in view.binds]
    assert order.index(str(writable)) < order.index(str(writable / ".git"))  # wins


def test_held_secrets_are_values_not_paths(tmp_path: Path) -> None:
    (tmp_path / "agent.sock").touch()
    env = {"ANTHROPIC_API_KEY": "sk-ant-x", "GITHUB_TOKEN": "", "PATH": "/usr/bin",
           "SSH_AUTH_SOCK": str(tmp_path / "agent.sock"), "INPUT_TOKEN": "ghs_x"}
    assert held_secrets(env) == ("ANTHROPIC_API_KEY", "INPUT_TOKEN")


PRELOAD_DRIVER = """
import json, sys
from kfbot.evaluate.sandbox import credentials
from kfbot.cli import PRELOADED
from kfbot.evaluate.sandbox import configure, confined
wanted = ["kfbot.github.publish", "kfbot.search.mutators.llm", "anthropic", "github"]
configure(False, ["ANTHROPIC_API_KEY"], lambda: credentials.preload(PRELOADED["optimize"]))
before = [name in sys.modules for name in wanted]
confined(["true"], "/")
print(json.dumps({"before": before, "after": [name in sys.modules for name in wanted],
                  "torch": "torch" in sys.modules}))
"""


def test_what_a_secret_holder_needs_later_is_imported_before_untrusted_code_runs() -> None:
    done = subprocess.run([sys.executable, "-c", PRELOAD_DRIVER], capture_output=True,
                          text=True, timeout=300, check=True)
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"before": [False] * 4, "after": [True] * 4, "torch": False}
