"""Secrets in the forms code can print them in are taken out of everything kfbot writes:
each encoding below, alone and inside other text; ordinary text is left alone."""

from __future__ import annotations

import base64
import codecs
import io
import sys
import urllib.parse
from collections.abc import Callable

import pytest

from kfbot.github.redaction import Redactor, redacted_streams

TOKEN = "ghs_16C7e42F292c6912E7710c838347Ae178B4a"
KEY = "sk-ant-api03-test-Zq8vW2xKpL9mN4rT6yU1iO3aS5dF7gH0jK2lM4nB6vC8xZ"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


ENCODINGS: dict[str, Callable[[str], str]] = {
    "plain": lambda s: s,
    "reversed": lambda s: s[::-1],
    "spaced": lambda s: " ".join(s),
    "one per line": lambda s: "\n".join(s),
    "dashes and dots": lambda s: "".join(ch + "-." [i % 2] for i, ch in enumerate(s)),
    "upper case": str.upper,
    "swapped case": str.swapcase,
    "rot13": lambda s: codecs.encode(s, "rot13"),
    "rot13 reversed": lambda s: codecs.encode(s, "rot13")[::-1],
    "base64": lambda s: _b64(s.encode()),
    "base64 unpadded": lambda s: _b64(s.encode()).rstrip("="),
    "base64 of the push header": lambda s: _b64(f"x-access-token:{s}".encode()),
    "base64 at offset 1": lambda s: _b64(b"A" + s.encode() + b"!"),
    "base64 at offset 2": lambda s: _b64(b"AB" + s.encode()),
    "base64 in lines of 16": lambda s: "\n".join(
        _b64(b"token=" + s.encode())[i:i + 16] for i in range(0, 100, 16)),
    "base64url": lambda s: base64.urlsafe_b64encode(b"?>" + s.encode()).decode(),
    "base32": lambda s: base64.b32encode(b"xyz" + s.encode()).decode(),
    "hex": lambda s: s.encode().hex(),
    "HEX": lambda s: s.encode().hex().upper(),
    "hex reversed": lambda s: s.encode()[::-1].hex(),
    "hex with colons": lambda s: ":".join(f"{b:02x}" for b in s.encode()),
    "\\x escapes": lambda s: "".join(f"\\x{b:02x}" for b in s.encode()),
    "0x list": lambda s: ", ".join(f"0x{b:02X}" for b in s.encode()),
    "\\u escapes": lambda s: "".join(f"\\u{b:04x}" for b in s.encode()),
    "URL-encoded": lambda s: "".join(f"%{b:02X}" for b in s.encode()),
    "URL-quoted": lambda s: urllib.parse.quote(s, safe=""),
    "decimal codes": lambda s: ",".join(str(b) for b in s.encode()),
    "HTML entities": lambda s: "".join(f"&#{b};" for b in s.encode()),
}


@pytest.mark.parametrize("secret", [TOKEN, KEY], ids=["token", "anthropic key"])
@pytest.mark.parametrize("encoding", ENCODINGS, ids=list(ENCODINGS))
def test_every_encoding_is_redacted(secret: str, encoding: str) -> None:
    form = ENCODINGS[encoding](secret)
    out = Redactor([TOKEN, KEY])(f"AssertionError: got {form} from the server\n")
    assert out.startswith("AssertionError: got ") and out.endswith(" from the server\n")
    assert "***" in out
    # Nothing long of the encoded secret is left: what remains is its edges at most.
    middle = form[len(form) // 2 - 4: len(form) // 2 + 4]
    assert middle not in out


def test_text_without_secrets_is_left_alone() -> None:
    text = ("ghs_ is a prefix; 67 68 73 5f; Z2hzXw==; 0x10, 0x20; sk-ant-api03-\n"
            "| kernel | 1.84x | (4096, 1024) float32 |\n" + _b64(b"unrelated bytes" * 9))
    assert Redactor([TOKEN, KEY])(text) == text


def test_short_values_are_matched_plainly_only() -> None:
    redact = Redactor(["abcd", "xy", ""])
    assert redact("abcd a b c d dcba xy") == "*** a b c d dcba xy"


def test_the_runner_is_asked_to_mask_the_exact_forms() -> None:
    masks = Redactor([TOKEN]).mask_commands()
    for form in (TOKEN, TOKEN[::-1], TOKEN.encode().hex(), _b64(TOKEN.encode()),
                 _b64(f"x-access-token:{TOKEN}".encode())):
        assert f"::add-mask::{form}" in masks


def test_printed_lines_are_redacted_even_when_written_in_pieces() -> None:
    out = io.StringIO()
    saved = sys.stdout
    sys.stdout = out
    try:
        with redacted_streams(Redactor([TOKEN])):
            print("the token is", TOKEN[:10], end="")
            print(TOKEN[10:], "reversed", TOKEN[::-1])
            sys.stdout.write(f"no newline yet {TOKEN}")
    finally:
        sys.stdout = saved
    assert out.getvalue() == "the token is *** reversed ***\nno newline yet ***"
