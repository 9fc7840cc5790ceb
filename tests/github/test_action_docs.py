"""What action.yml declares is what docs/github-action.md says, and the example
workflows lint with the actionlint configuration shipped beside them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
DOCS = (ROOT / "docs" / "github-action.md").read_text()
# Labels actionlint knows without configuration (GitHub-hosted images and the
# self-hosted defaults).
KNOWN_LABELS = re.compile(r"self-hosted|linux|macos|windows|x64|arm|arm64|"
                          r"(ubuntu|macos|windows)-[\w.-]+")


def table(heading: str) -> dict[str, list[str]]:
    """The rows of the Markdown table under `## heading`: first cell -> the others."""
    section = DOCS.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines()
            if line.startswith("| `")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_every_input_is_documented_with_its_default() -> None:
    documented = table("Inputs")
    assert {f"`{name}`" for name in ACTION["inputs"]} == set(documented)
    for name, spec in ACTION["inputs"].items():
        default = str(spec.get("default", ""))
        assert documented[f"`{name}`"][0] == (f"`{default}`" if default else ""), name


def test_every_output_is_documented_alike() -> None:
    documented = {name.strip("` ") for cell in table("Outputs") for name in cell.split(",")}
    assert documented == set(ACTION["outputs"])
    said = set(re.findall(r"`(\w+)`", table("Outputs")["`pr-operation`"][0]))
    described = set(re.findall(r"\b(created|updated|unchanged|skipped|none|dry-run)\b",
                               ACTION["outputs"]["pr-operation"]["description"]))
    assert said == described == {"created", "updated", "unchanged", "none"}


def _runs_on(workflow: dict[str, Any]) -> set[str]:
    labels: set[str] = set()
    for job in workflow["jobs"].values():
        value = job.get("runs-on", [])
        labels |= {value} if isinstance(value, str) else set(value)
    return labels


def test_actionlint_knows_every_runner_label_of_the_examples() -> None:
    config = yaml.safe_load((ROOT / "examples" / "actionlint.yaml").read_text())
    assert set(config) <= {"self-hosted-runner", "config-variables", "paths"}
    configured = set(config["self-hosted-runner"]["labels"])
    used = set().union(*(_runs_on(yaml.safe_load(p.read_text()))
                         for p in (ROOT / "examples" / "workflows").glob("*.yml")))
    custom = {label for label in used if not KNOWN_LABELS.fullmatch(label)}
    assert custom == configured == {"gpu"}
