"""Tests marked `gpu` need a CUDA GPU; without one they are skipped with the reason."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _scratch_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What the commands under test cache (`kfbot scan`'s facts, builds) goes to a scratch
    folder, not the cache of the person running the tests."""
    if "KFBOT_CACHE" not in os.environ:
        os.environ["KFBOT_CACHE"] = str(tmp_path_factory.mktemp("kfbot-cache"))


@pytest.fixture(autouse=True)
def _no_inherited_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output is wrapped to `$COLUMNS` where it is set; a CI runner or a terminal sets it
    to whatever it is, so a test that wants a width says it, and the others see none."""
    monkeypatch.delenv("COLUMNS", raising=False)
