"""The install path the docs promise exists: a licence that matches pyproject's, a
changelog section for the version, and every version pin in the README and the docs
(`rev:` for pre-commit, `kfbot/kfbot@` for workflows, `kfbot==` for pip) one that the
tag policy of docs/releasing.md makes from pyproject's version."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 runner
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
MAJOR, MINOR, _ = VERSION.split(".")
# The documents whose pins are checked: the README, the docs, the changelog.
DOCUMENTS = ["README.md", "CHANGELOG.md", "docs/precommit.md", "docs/releasing.md",
             "docs/github-action.md", "examples/workflows/kfbot-comment.yml",
             "examples/workflows/kfbot-pull-request.yml", "examples/workflows/kfbot-schedule.yml"]
PINS = {
    "pre-commit rev": (re.compile(r"\brev:\s*(v[\w.]+)"), f"v{VERSION}"),
    "workflow tag": (re.compile(r"kfbot/kfbot@(v[\w.]+)"), f"v{MAJOR}.{MINOR}"),
    "pip pin": (re.compile(r"\bkfbot==([\w.]+)"), VERSION),
}


def test_the_version_is_a_zero_x_release() -> None:
    # docs/releasing.md's policy is for 0.x: the minor tag moves, there is no v1.
    assert re.fullmatch(r"0\.\d+\.\d+", VERSION), VERSION


def test_the_licence_is_the_apache_text_pyproject_names() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_changelog_starts_with_this_version() -> None:
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0] == VERSION, headings


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_version_pin_follows_from_pyprojects_version(document: str) -> None:
    text = (ROOT / document).read_text()
    for what, (pattern, wanted) in PINS.items():
        for found in pattern.findall(text):
            assert found == wanted, f"{document}: {what} {found}, not {wanted}"
    # Other projects' actions (actions/create-github-app-token@v1) keep their own tags.
    assert not re.search(r"kfbot@v1\b|rev:\s*v1\.\d+\.\d+", text), document
