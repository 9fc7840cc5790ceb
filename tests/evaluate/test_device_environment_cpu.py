"""The device description's nvidia-smi query: which GPU it asks about, and its parse."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kfbot.evaluate.device import environment


def _fake_smi(tmp_path: Path, answer: str) -> Path:
    """An nvidia-smi on PATH that records its arguments and prints `answer`."""
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\nprintf \'{answer}\\n\'\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe.parent


@pytest.mark.parametrize(("visible", "asked"), [
    (None, "0"), ("", "0"), ("2", "2"), ("3,1", "3"), (" GPU-4f2a , 0", "GPU-4f2a"),
])
def test_the_query_names_the_first_visible_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, visible: str | None, asked: str
) -> None:
    monkeypatch.setenv("PATH", f"{_fake_smi(tmp_path, '550.54.15, 1980 MHz')}{os.pathsep}"
                               f"{os.environ['PATH']}")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    facts = environment._nvidia_smi()
    assert facts == {"driver": "550.54.15", "sm_clock_max": "1980 MHz"}
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("-i") + 1] == asked


def test_no_nvidia_smi_gives_no_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert environment._nvidia_smi() == {}
