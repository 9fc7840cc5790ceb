"""The optional parts of kfbot, and what to install when one is missing.

`pip install kfbot` brings what `scan`, `check`, `lessons` and the reports need
(tree-sitter and its grammars, PyYAML, rich). The rest comes with an extra:

    kfbot[gpu]     torch, numpy, pytest (the capture runs the repository's tests)
                   and matplotlib (optimize's progress.png): verify, bench,
                   optimize, hook verify
    kfbot[github]  PyGithub: the Action, comment commands, `optimize --publish`
    kfbot[llm]     anthropic: the LLM mutator (without it, params and rules still run)
    kfbot[ray]     Ray: `optimize --executor ray`

A command that needs a missing one stops with exit 3 and the `pip install` line.
"""

from __future__ import annotations

import importlib.util

from kfbot.errors import EXIT_MISSING_TOOL, KfbotError

# The top-level module each extra brings -> (the extra, the package's name on PyPI).
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("gpu", "torch"),
    "numpy": ("gpu", "numpy"),
    "pytest": ("gpu", "pytest"),
    "matplotlib": ("gpu", "matplotlib"),
    "github": ("github", "PyGithub"),
    "anthropic": ("llm", "anthropic"),
    "ray": ("ray", "ray"),
}


def install_line(extra: str) -> str:
    return f"pip install 'kfbot[{extra}]'"


def missing(module: str, needed_by: str) -> KfbotError:
    """The error for `needed_by` (a command) when `module` of an extra is missing."""
    extra, package = EXTRAS[module]
    return KfbotError(f"{needed_by} needs {package}, which is not installed: "
                      f"{install_line(extra)}", EXIT_MISSING_TOOL)


def require(module: str, needed_by: str) -> None:
    """A KfbotError naming the extra to install unless `module` can be imported."""
    if importlib.util.find_spec(module) is None:
        raise missing(module, needed_by)


def from_import_error(exc: ImportError, needed_by: str) -> KfbotError | None:
    """The same error for an import that failed on a module of an extra; None for any
    other import error, which is a bug to report as it is."""
    root = (exc.name or "").partition(".")[0]
    return missing(root, needed_by) if root in EXTRAS else None
