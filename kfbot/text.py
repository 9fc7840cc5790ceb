"""Text that kfbot reads from a repository, writes back into one, or echoes to a person.

Kernel sources are edited as text and committed back, so they must survive the round
trip byte for byte: they are decoded as strict UTF-8 with their line endings kept, and
written back with the same encoding. A file that is not UTF-8 is refused when a task is
made, before any GPU time is spent, rather than silently changed by a replacement
character in a published commit.

Text that came from a user (a comment, a file name, a kernel name) and is echoed back
in a comment, a job summary or a terminal goes through `shown`: cut to a length a
reader can take in, with control characters (terminal escape sequences among them)
made visible instead of interpreted.
"""

from __future__ import annotations

from pathlib import Path

from kfbot.errors import KfbotError

SHOWN_LIMIT = 80
_ELLIPSIS = "…"


class NotUtf8Error(KfbotError):
    """A source file kfbot would have to edit is not valid UTF-8."""


def decode_source(data: bytes, rel: str) -> str:
    """`data` as text, exactly; a file that is not UTF-8 is an error naming the place."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise NotUtf8Error(
            f"{rel}:{line}:{column}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); kfbot "
            "edits and commits kernel sources as UTF-8 text and would change these bytes: "
            "convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None


def read_source(path: Path, rel: str) -> str:
    """The file's text, byte-exact (line endings kept); refuses a file that is not UTF-8."""
    return decode_source(path.read_bytes(), rel)


def write_source(path: Path, text: str) -> None:
    """Write text read by `read_source` back so that unchanged lines keep their bytes."""
    path.write_bytes(text.encode("utf-8"))


def shown(text: str, limit: int = SHOWN_LIMIT) -> str:
    """`text` fit to be echoed: non-printable characters escaped, cut to `limit` characters."""
    out = "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)
    if len(out) <= limit:
        return out
    return out[: max(limit - 1, 0)] + _ELLIPSIS


def printable(text: str) -> str:
    """`text` with control characters made visible (line breaks and tabs kept), for a
    terminal or a log: a file name or a message must not move the cursor or recolour."""
    return "".join(ch if ch.isprintable() or ch in "\n\t" else _escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    return repr(ch)[1:-1]  # "\x1b", "\n", "\u2028": visible, never interpreted


def utf8_safe(text: str) -> str:
    """`text` as valid UTF-8. A file name that is not UTF-8 reaches kfbot with its bytes
    as lone surrogates (Python's surrogateescape), which no UTF-8 writer accepts: those
    bytes are shown as `\\xNN` instead, so every file the runner reads stays UTF-8 and
    the name stays recognisable."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that stood for no byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
