"""Hidden HTML-comment markers that let kfbot find its own pull requests and comments.

    <!-- kfbot:pr kernel=csrc/softmax.cu::softmax_kernel sha=1a2b... speedup=1.840 -->
    <!-- kfbot:status pr=12 command=optimize -->

GitHub renders none of it. A marker is the word `kfbot:<kind>` and `key=value` fields;
values are percent-encoded where they hold a space, `%`, `=`, `<`, `>` or `--`, so any id
round-trips. Finding a marker by its fields is how a re-run edits what it wrote before
instead of writing it again.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping

_MARKER = re.compile(r"<!--\s*kfbot:(?P<kind>[a-z][a-z-]*)(?P<fields>(?:\s+[a-z_]+=\S*)*)\s*-->")
_FIELD = re.compile(r"([a-z_]+)=(\S*)")
_SAFE = "/:.,_+@~()[]*&^!?#;'{}|"  # kept readable; never `=`, `%`, spaces, `<`, `>`
_DASHES = re.compile(r"-(?=-)|(?<=-)-")  # `--` may not appear inside an HTML comment


def make_marker(kind: str, **fields: str | int | float) -> str:
    """`<!-- kfbot:<kind> key=value ... -->`, fields in the order given."""
    if not re.fullmatch(r"[a-z][a-z-]*", kind):
        raise ValueError(f"marker kind {kind!r} must be lower-case letters and dashes")
    parts = [f"kfbot:{kind}"]
    parts += [f"{key}={_encode(str(value))}" for key, value in fields.items()]
    return f"<!-- {' '.join(parts)} -->"


def _encode(value: str) -> str:
    return _DASHES.sub("%2D", urllib.parse.quote(value, safe=_SAFE))


def find_markers(text: str, kind: str) -> list[dict[str, str]]:
    """The fields of every `kind` marker in `text`, in order."""
    return [{key: urllib.parse.unquote(value) for key, value in _FIELD.findall(m["fields"])}
            for m in _MARKER.finditer(text or "") if m["kind"] == kind]


def find_marker(text: str, kind: str, **match: str | int) -> dict[str, str] | None:
    """The first `kind` marker whose fields include all of `match`, or None."""
    wanted = {key: str(value) for key, value in match.items()}
    for fields in find_markers(text, kind):
        if all(fields.get(key) == value for key, value in wanted.items()):
            return fields
    return None


def pr_marker(kernel: str, **extra: str | int | float) -> str:
    """The marker in the body of the pull request kfbot keeps for `kernel`."""
    return make_marker("pr", kernel=kernel, **extra)


def find_pr_marker(body: str, kernel: str | None = None) -> dict[str, str] | None:
    """The pull-request marker in `body` (for `kernel`, when given), or None."""
    return find_marker(body, "pr", **({"kernel": kernel} if kernel else {}))


def status_marker(pr: int, command: str) -> str:
    """The marker in kfbot's reply to a `/kfbot <command>` comment on pull request `pr`."""
    return make_marker("status", pr=pr, command=command)


def find_status_marker(body: str, pr: int | None = None,
                       command: str | None = None) -> dict[str, str] | None:
    """The status marker in `body` (for that PR and command, when given), or None."""
    match: Mapping[str, str | int] = {k: v for k, v in (("pr", pr), ("command", command))
                                      if v is not None}
    return find_marker(body, "status", **match)
