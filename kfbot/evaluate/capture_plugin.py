"""The pytest plugin that records how named ops are called by a repository's tests.

Loaded with `-p kfbot.evaluate.capture_plugin` and switched on by the
`KFBOT_CAPTURE` environment variable (see `kfbot.evaluate.capture`). The results go
to the request's `out` after each test that recorded something (so a run killed for
time still leaves what it saw) and at the end of the session, failures or not.
Under pytest-xdist each worker writes `<out>.<worker id>`.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from kfbot.errors import KfbotError
from kfbot.evaluate.capture import Capture, one_line, output_path, request_from_environment
from kfbot.evaluate.signature import CAPTURE_ENV

_KEY = pytest.StashKey[Capture]()


def _start(config: pytest.Config) -> None:
    if _KEY in config.stash:
        return
    try:
        request = request_from_environment()
    except (ValueError, KfbotError) as exc:
        raise pytest.UsageError(f"{CAPTURE_ENV}: {one_line(exc)}") from exc
    if request is None:
        return
    capture = Capture(request)
    capture.install()
    config.stash[_KEY] = capture


def _write(capture: Capture) -> None:
    # A failed write is told on stderr; the caller reports the missing file.
    capture.save(output_path(capture.request.out))


def _capture(config: pytest.Config) -> Capture | None:
    return config.stash.get(_KEY, None)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # Before the repository's conftest files run: they may load the extension.
    _start(early_config)


def pytest_configure(config: pytest.Config) -> None:
    _start(config)  # when the plugin was registered too late for the hook above


def pytest_collection_modifyitems(config: pytest.Config) -> None:
    capture = _capture(config)
    if capture is not None:
        capture.import_callables()
        capture.refresh()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, None]:
    capture = _capture(item.config)
    if capture is not None:
        capture.test_id = item.nodeid
    yield
    if capture is not None:
        capture.test_id = ""
        if capture.dirty:
            _write(capture)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    capture = _capture(item.config)
    if capture is not None:
        capture.refresh()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    # Fixtures may have loaded the library that registers an op.
    capture = _capture(item.config)
    if capture is not None:
        capture.refresh()


def pytest_sessionfinish(session: pytest.Session) -> None:
    capture = _capture(session.config)
    if capture is not None:
        capture.test_id = ""
        _write(capture)


def pytest_unconfigure(config: pytest.Config) -> None:
    capture = _capture(config)
    if capture is not None:
        capture.uninstall()
        del config.stash[_KEY]
