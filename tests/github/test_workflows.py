"""action.yml, the example workflows and CI, read with PyYAML: the safety properties.

The checks are functions so each is also shown to catch the mistake it is for (the
`test_checks_catch_*` tests feed them an unsafe workflow).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kfbot.github import action_io

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
EXAMPLES = sorted((ROOT / "examples" / "workflows").glob("*.yml"))
CI = ROOT / ".github" / "workflows" / "ci.yml"
WORKFLOWS = [*EXAMPLES, CI]
KEBAB = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
OUTPUTS = {"pr-url", "pr-number", "pr-operation", "best-speedup", "report-path", "authorized",
           "head-sha"}
# Text anyone can write: the comment, titles, bodies, branch names, commit messages.
UNTRUSTED = re.compile(
    r"github\.(?:event\.(?:comment\.body|issue\.(?:title|body)|pull_request\.(?:title|body|"
    r"head\.ref|head\.label)|review\.body|review_comment\.body|head_commit\.message|"
    r"commits\b|discussion\.(?:title|body)|workflow_run\.head_branch)|head_ref)")
# What the jobs may ask for, at most.
ALLOWED_PERMISSIONS = {"contents": {"read", "write"}, "pull-requests": {"read", "write"},
                       "issues": {"read", "write"}}


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def _on(workflow: dict[str, Any]) -> Any:
    # YAML 1.1 reads the key `on` as the boolean true.
    return workflow.get("on", workflow.get(True))


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


# ---- the checks --------------------------------------------------------------------------------


def untrusted_in_run(steps: list[dict[str, Any]]) -> list[str]:
    """`run:` scripts that expand untrusted text (script injection)."""
    return [step["run"] for step in steps if "run" in step
            and any(UNTRUSTED.search(expr) for expr in re.findall(r"\$\{\{(.*?)\}\}",
                                                                  step["run"]))]


def permission_problems(workflow: dict[str, Any]) -> list[str]:
    problems = []
    top = workflow.get("permissions")
    if top is None:
        problems.append("no top-level permissions: the token gets the repository default")
    elif top != {} and not (isinstance(top, dict) and set(top.values()) <= {"read"}):
        problems.append(f"top-level permissions are more than read-only: {top}")
    for name, job in workflow["jobs"].items():
        granted = job.get("permissions", top)
        if not isinstance(granted, dict):
            problems.append(f"job {name}: permissions {granted!r}")
            continue
        for scope, level in granted.items():
            if level not in ALLOWED_PERMISSIONS.get(scope, set()):
                problems.append(f"job {name}: {scope}: {level}")
    return problems


def checkout_problems(steps: list[dict[str, Any]]) -> list[str]:
    return [str(step) for step in steps if str(step.get("uses", "")).startswith(
        "actions/checkout") and (step.get("with") or {}).get("persist-credentials") is not False]


def _uses(step: dict[str, Any], name: str) -> bool:
    return str(step.get("uses", "")).startswith(name)


def _kfbot(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for step in job.get("steps", []) if _uses(step, "kfbot/")]


def write_token_problems(workflow: dict[str, Any]) -> list[str]:
    """Jobs that check the repository out run its code: no token that can write there, no
    secret but the Anthropic key, and kfbot hands its run over as an artifact."""
    problems = []
    top = workflow.get("permissions") or {}
    for name, job in workflow["jobs"].items():
        if not any(_uses(step, "actions/checkout") for step in job.get("steps", [])):
            continue
        granted = job.get("permissions", top)
        if not isinstance(granted, dict) or set(granted.items()) - {("contents", "read")}:
            problems.append(f"job {name} runs the repository's code with permissions "
                            f"{granted!r}")
        for step in _kfbot(job):
            given = step.get("with") or {}
            if "token" in given:
                problems.append(f"job {name}: kfbot gets a token: {given['token']}")
            if not given.get("artifact"):
                problems.append(f"job {name}: kfbot does not hand its run over (artifact)")
            if step.get("env"):
                problems.append(f"job {name}: kfbot's step sets env: {step['env']}")
        secrets = {m for m in re.findall(r"secrets\.(\w+)", yaml.safe_dump(job))}
        if secrets - {"ANTHROPIC_API_KEY"}:
            problems.append(f"job {name}: secrets {sorted(secrets)} beside the repository's code")
    return problems


def publish_job_problems(workflow: dict[str, Any]) -> list[str]:
    """The job that writes to GitHub: a GitHub-hosted runner, nothing checked out, no
    script, only the artifact and kfbot's publish command."""
    problems = []
    for name, job in workflow["jobs"].items():
        kfbot = _kfbot(job)
        if not any((step.get("with") or {}).get("command") == "publish" for step in kfbot):
            continue
        if job.get("runs-on") != "ubuntu-latest":
            problems.append(f"job {name} publishes on {job.get('runs-on')}")
        for step in job.get("steps", []):
            if not (_uses(step, "actions/download-artifact") or _uses(step, "kfbot/")):
                problems.append(f"job {name} runs {step.get('uses') or step.get('run')}")
    return problems


# ---- action.yml ------------------------------------------------------------------------------


def test_action_is_composite_with_kebab_case_inputs_all_handled_by_the_code() -> None:
    action = _load(ACTION)
    assert action["runs"]["using"] == "composite"
    names = set(action["inputs"])
    assert all(KEBAB.fullmatch(name) for name in names), names
    handled = set(action_io.INPUTS) | set(action_io.STEP_ONLY_INPUTS) | \
        set(action_io.ENV_INPUTS)
    assert names == handled
    (run_step,) = [s for s in action["runs"]["steps"] if s.get("id") == "kfbot"]
    expected = {action_io.env_name(n): f"${{{{ inputs.{n} }}}}" for n in action_io.INPUTS}
    assert {k: v for k, v in run_step["env"].items() if k.startswith("INPUT_")} == expected
    for name, variable in action_io.ENV_INPUTS.items():
        assert run_step["env"][variable] == f"${{{{ inputs.{name} }}}}"
    assert "-m kfbot action" in run_step["run"]


def test_action_outputs_come_from_the_kfbot_step() -> None:
    outputs = _load(ACTION)["outputs"]
    assert set(outputs) == OUTPUTS
    for name, spec in outputs.items():
        assert spec["value"] == f"${{{{ steps.kfbot.outputs.{name} }}}}"


def test_action_scripts_expand_nothing_and_keep_the_runners_torch() -> None:
    steps = _load(ACTION)["runs"]["steps"]
    for step in steps:
        assert "${{" not in step.get("run", ""), step["run"]  # values come through env:
        # -p: no $BASH_ENV, no functions from the environment (see test_security.py).
        assert step.get("shell") == "bash --noprofile --norc -p -eo pipefail {0}"
    install = steps[0]["run"]
    assert 'pip install' in install and '"$GITHUB_ACTION_PATH[github,llm]"' in install
    # The runner's packages become visible only after the install, as plain paths.
    assert install.index("pip install") < install.index("_kfbot_runner_site.pth")
    assert "addsitedir" not in install and "import site;" in install
    assert "[gpu]" not in install and "torch==" not in install
    assert "--force-reinstall" not in install and "--upgrade " not in install
    assert 'if [ "$before" != "$after" ]' in install  # fails if torch was touched
    assert _load(ACTION)["inputs"]["python"]["default"] == "python3"


# ---- the workflows ---------------------------------------------------------------------------


def test_there_are_the_three_example_workflows() -> None:
    triggers = {path.name: set(_on(_load(path))) for path in EXAMPLES}
    assert triggers == {"kfbot-comment.yml": {"issue_comment"},
                        "kfbot-pull-request.yml": {"pull_request"},
                        "kfbot-schedule.yml": {"schedule", "workflow_dispatch"}}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege_permissions(path: Path) -> None:
    assert permission_problems(_load(path)) == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_checkouts_do_not_persist_credentials(path: Path) -> None:
    steps = _steps(_load(path))
    assert any(str(s.get("uses", "")).startswith("actions/checkout") for s in steps)
    assert checkout_problems(steps) == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_untrusted_text_is_expanded_in_scripts(path: Path) -> None:
    assert untrusted_in_run(_steps(_load(path))) == []


@pytest.mark.parametrize(("name", "group_part"), [
    ("kfbot-comment.yml", "github.event.issue.number"),
    ("kfbot-pull-request.yml", "github.event.pull_request.number"),
])
def test_pull_request_workflows_run_one_at_a_time_per_pull_request(name: str,
                                                                    group_part: str) -> None:
    concurrency = _load(ROOT / "examples" / "workflows" / name)["concurrency"]
    assert group_part in concurrency["group"]


def test_comment_workflow_authorizes_before_any_checkout() -> None:
    """A job that checks nothing out authorizes; the GPU job checks out the pinned head."""
    workflow = _load(ROOT / "examples" / "workflows" / "kfbot-comment.yml")
    assert _on(workflow) == {"issue_comment": {"types": ["created"]}}
    authorize, gpu = workflow["jobs"]["authorize"], workflow["jobs"]["gpu"]
    assert "github.event.issue.pull_request" in authorize["if"]
    assert "github.event.comment.author_association" in authorize["if"]
    assert all("checkout" not in str(s.get("uses", "")) for s in authorize["steps"])
    assert authorize["runs-on"] == "ubuntu-latest"  # no pull request code near the GPU runner
    (step,) = authorize["steps"]
    assert step["with"]["command"] == "authorize"
    assert gpu["needs"] == "authorize"
    assert gpu["if"] == "needs.authorize.outputs.authorized == 'true'"
    checkout, run, upload = gpu["steps"]
    assert upload["uses"].startswith("actions/upload-artifact")
    assert checkout["with"]["ref"] == "${{ needs.authorize.outputs.head-sha }}"
    assert run["with"]["head-sha"] == "${{ needs.authorize.outputs.head-sha }}"
    publish = workflow["jobs"]["publish"]
    assert publish["needs"] == ["authorize", "gpu"]
    assert "needs.authorize.outputs.authorized == 'true'" in publish["if"]
    assert publish["steps"][-1]["with"]["head-sha"] == "${{ needs.authorize.outputs.head-sha }}"


def test_pull_request_workflow_runs_no_fork_code_on_the_gpu_runner() -> None:
    job = _load(ROOT / "examples" / "workflows" / "kfbot-pull-request.yml")["jobs"]["guard"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in job["if"]
    assert job["steps"][0]["with"]["fetch-depth"] == 0  # the base commit must be there


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_job_that_runs_the_repositorys_code_holds_no_write_token(path: Path) -> None:
    assert write_token_problems(_load(path)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_a_publish_job_takes_the_gpu_jobs_artifact_and_runs_no_repository_code(
        path: Path) -> None:
    workflow = _load(path)
    assert publish_job_problems(workflow) == []
    jobs = workflow["jobs"]
    (gpu,) = [n for n, job in jobs.items() if any(_uses(s, "actions/checkout")
                                                  for s in job["steps"])]
    (publish,) = [n for n, job in jobs.items() if any(
        (s.get("with") or {}).get("command") == "publish" for s in _kfbot(job))]
    needs = jobs[publish]["needs"]
    assert gpu in ([needs] if isinstance(needs, str) else needs)
    upload = next(s for s in jobs[gpu]["steps"] if _uses(s, "actions/upload-artifact"))
    download = next(s for s in jobs[publish]["steps"] if _uses(s, "actions/download-artifact"))
    handed = _kfbot(jobs[gpu])[0]["with"]["artifact"]
    assert upload["if"] == "always()"  # a failed guard still has its verdict posted
    assert upload["with"]["path"] == handed and upload["with"]["name"] == \
        download["with"]["name"]
    assert _kfbot(jobs[publish])[0]["with"]["artifact"] == download["with"]["path"]
    assert "!cancelled()" in jobs[publish]["if"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_use_only_inputs_the_action_has(path: Path) -> None:
    inputs = set(_load(ACTION)["inputs"])
    used = [s for s in _steps(_load(path)) if str(s.get("uses", "")).startswith("kfbot/")]
    assert used
    for step in used:
        assert set(step.get("with", {})) <= inputs


def test_ci_runs_the_same_command_as_ci_run() -> None:
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    runs = [s["run"] for s in _steps(_load(CI)) if "run" in s]
    assert runs == ["bash .ci/run"]
    assert {"push", "pull_request"} <= set(_on(_load(CI)))


# ---- the checks catch what they are for ---------------------------------------------------------

UNSAFE = """
on: issue_comment
permissions: write-all
jobs:
  bad:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.comment.body }}"
      - run: git push origin ${{ github.head_ref }}
      - run: echo "${{ github.event.issue.number }}"
"""


def test_checks_catch_an_unsafe_workflow() -> None:
    workflow = yaml.safe_load(UNSAFE)
    steps = _steps(workflow)
    assert untrusted_in_run(steps) == [steps[1]["run"], steps[2]["run"]]
    assert checkout_problems(steps) == [str(steps[0])]
    assert permission_problems(workflow) == ["top-level permissions are more than read-only: "
                                             "write-all", "job bad: permissions 'write-all'"]
    workflow["permissions"] = {}
    workflow["jobs"]["bad"]["permissions"] = {"contents": "write", "actions": "write"}
    assert permission_problems(workflow) == ["job bad: actions: write"]


ONE_JOB = """
on: schedule
permissions: {}
jobs:
  optimize:
    runs-on: [self-hosted, gpu]
    permissions: {contents: write, pull-requests: write}
    steps:
      - uses: actions/checkout@v4
        with: {persist-credentials: false}
      - uses: kfbot/kfbot@v1
        with: {token: "${{ secrets.KFBOT_TOKEN }}"}
  publish:
    runs-on: [self-hosted, gpu]
    steps:
      - run: pip install .
      - uses: kfbot/kfbot@v1
        with: {command: publish}
"""


def test_checks_catch_a_write_token_beside_the_repositorys_code() -> None:
    workflow = yaml.safe_load(ONE_JOB)
    assert write_token_problems(workflow) == [
        "job optimize runs the repository's code with permissions {'contents': 'write', "
        "'pull-requests': 'write'}", "job optimize: kfbot gets a token: ${{ "
        "secrets.KFBOT_TOKEN }}", "job optimize: kfbot does not hand its run over (artifact)",
        "job optimize: secrets ['KFBOT_TOKEN'] beside the repository's code"]
    assert publish_job_problems(workflow) == ["job publish publishes on ['self-hosted', 'gpu']",
                                              "job publish runs pip install ."]
