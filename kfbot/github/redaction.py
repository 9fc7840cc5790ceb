"""Secrets taken out of everything kfbot writes, in the forms code can print them in.

    redact = Redactor([token, anthropic_key])
    redact(text)              # every form below replaced with ***
    redact.mask_commands()    # ::add-mask:: lines, so the runner hides the exact forms too

Code kfbot runs on purpose (a repository's tests, its build) may print a secret it got
hold of, and kfbot posts parts of what it printed. Replacing the plain value is not
enough: a test can print it reversed, spaced out, in another letter case, as base64
(alone, or the `x-access-token:TOKEN` of a git push, at any offset inside a longer
base64 text, with line breaks), base64url, base32, hex (with `\\x`, `0x`, `%`, `\\u00`
or `&#x` before each byte, any separators between), decimal codes, URL-encoded, or
ROT13. Each of those is matched here. What is not (a secret printed a few characters at
a time across lines, or encrypted) cannot be caught by looking at text: that is why
the job that runs such code holds no token that can write.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import io
import re
import sys
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO

from kfbot.text import utf8_safe

MIN_LENGTH = 4  # shorter values are not secrets worth matching (and would match anything)
MIN_ENCODED = 8  # values from this length on are matched in every encoding
_SEP = r"[^0-9A-Za-z]{0,3}"  # what may stand between the characters of a spaced-out value
_HEX_BYTE = r"(?:\\x|0x|%|\\u00|&#x)?{}"
_BASE64_SEP = r"\s{0,2}"  # MIME and PEM break base64 into lines


class Redactor:
    """Replaces every known secret, in every form above, with `***`."""

    def __init__(self, values: Iterable[str]) -> None:
        exact: set[str] = set()
        patterns: list[tuple[int, str]] = []
        for value in dict.fromkeys(values):
            if len(value) < MIN_LENGTH:
                continue
            exact |= {value, basic_auth(value)}
            if len(value) >= MIN_ENCODED:
                exact |= _exact_forms(value)
                patterns += _patterns(value)
        # Longest first, so a secret that contains another is replaced whole.
        self.forms = tuple(sorted(exact, key=len, reverse=True))
        self._patterns = tuple(re.compile(p, re.IGNORECASE if kind < 3 else 0)
                               for kind, p in _ordered(patterns))

    def __call__(self, text: str) -> str:
        for form in self.forms:
            text = text.replace(form, "***")
        for pattern in self._patterns:
            text = pattern.sub("***", text)
        return text

    def mask_commands(self) -> list[str]:
        """`::add-mask::` lines: the runner then hides these values in every log line,
        also in what child processes print."""
        return [f"::add-mask::{_escape(form)}" for form in self.forms]


class RedactedStream(io.TextIOBase):
    """A text stream that writes whole lines through `redact` (a secret printed in pieces
    by several `write` calls within one line is still seen whole)."""

    def __init__(self, stream: TextIO, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.stream, self.redact, self.pending = stream, redact, ""

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        if lines:
            self.stream.write(utf8_safe(self.redact("\n".join(lines) + "\n")))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(utf8_safe(self.redact(self.pending)))
            self.pending = ""
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()


@contextlib.contextmanager
def redacted_streams(redact: Callable[[str], str]) -> Iterator[None]:
    """sys.stdout and sys.stderr through `redact` for the duration (kfbot's own prints
    and log records; what children write to inherited descriptors is the runner's
    `::add-mask::` to catch)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (RedactedStream(stream, redact) for stream in saved)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved


def basic_auth(token: str) -> str:
    """What an HTTPS git push with the token sends in its Authorization header."""
    return base64.b64encode(f"x-access-token:{token}".encode()).decode()


def _exact_forms(value: str) -> set[str]:
    data = value.encode()
    return {value[::-1], data.hex(), base64.b64encode(data).decode(),
            urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}


def _patterns(value: str) -> list[tuple[int, str]]:
    """(kind, regex) pairs: 0-2 match in any letter case, 3 exactly (base64 is case
    sensitive, and a case-blind match there would hit unrelated text)."""
    data = value.encode()
    found = []
    for text in (value, value[::-1], codecs.encode(value, "rot13"),
                 codecs.encode(value, "rot13")[::-1]):
        found.append((0, _SEP.join(re.escape(ch) for ch in text)))
    for seq in (data, data[::-1]):
        found.append((1, _SEP.join(_HEX_BYTE.format(f"{b:02x}") for b in seq)))
        found.append((2, r"(?<!\d)" + r"[^0-9]{1,3}".join(str(b) for b in seq) + r"(?!\d)"))
    for secret in (data, f"x-access-token:{value}".encode()):
        for core in _base_cores(secret):
            found.append((3, _BASE64_SEP.join(re.escape(ch) for ch in core)))
    return found


def _base_cores(data: bytes) -> set[str]:
    """The part of data's base64/base64url/base32 text that does not depend on what
    stands before or after it in a longer text, for each alignment."""
    cores = set()
    for k in range(3):
        text = base64.b64encode(b"\0" * k + data).decode()
        core = text[(4 * k + 2) // 3: len(text) - 4]
        cores |= {core, core.replace("+", "-").replace("/", "_")}
    for k in range(5):
        text = base64.b32encode(b"\0" * k + data).decode()
        cores.add(text[(8 * k + 4) // 5: len(text) - 8])
    return {core for core in cores if len(core) >= MIN_ENCODED}


def _ordered(patterns: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return sorted(dict.fromkeys(patterns), key=lambda p: (p[0], -len(p[1])))


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
