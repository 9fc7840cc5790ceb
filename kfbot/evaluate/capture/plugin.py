"""The pytest plugin that records how named ops are called by a repository's tests,
and, under observation, what each test launched on the GPU.

Loaded with `-p kfbot.evaluate.capture.plugin`, switched on by the `KFBOT_CAPTURE`
environment variable (see `kfbot.evaluate.capture.recorder`) and by `KFBOT_OBSERVE` (see
`kfbot.evaluate.capture.launches`). Call signatures go to the request's `out` as each
new one is seen (so a process that crashes keeps what came before), after each test
and at the end of the session, failures or not. Under pytest-xdist each worker
writes `<out>.<worker id>`. Observations are appended, one line per test, as each test
ends.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from kfbot.errors import KfbotError
from kfbot.evaluate.capture import launches
from kfbot.evaluate.capture.launch_recorder import Recorder
from kfbot.evaluate.capture.launches import Outcome
from kfbot.evaluate.capture.protocol import CAPTURE_ENV
from kfbot.evaluate.capture.recorder import Capture, one_line, output_path, request_from_environment

_KEY = pytest.StashKey[Capture]()
_OBSERVER = pytest.StashKey[Recorder]()
_OUTCOMES = pytest.StashKey[dict[str, Outcome]]()


def _start(config: pytest.Config) -> None:
    _start_observer(config)
    if _KEY in config.stash:
        return
    try:
        request = request_from_environment()
    except (ValueError, KfbotError) as exc:
        raise pytest.UsageError(f"{CAPTURE_ENV}: {one_line(exc)}") from exc
    if request is None:
        return
    capture = Capture(request, save_to=output_path(request.out))
    capture.install()
    observer = config.stash.get(_OBSERVER, None)
    if observer is not None:
        capture.around = observer.op_range
    config.stash[_KEY] = capture


def _start_observer(config: pytest.Config) -> None:
    if _OBSERVER in config.stash:
        return
    request = launches.request_from_environment()
    if request is not None:
        config.stash[_OBSERVER] = Recorder(request)
        config.stash[_OUTCOMES] = {}


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
    observer = item.config.stash.get(_OBSERVER, None)
    if capture is not None:
        capture.test_id = item.nodeid
    if observer is not None:
        observer.start(item.nodeid)
    yield
    if observer is not None:
        observer.stop(item.config.stash[_OUTCOMES].pop(item.nodeid, "passed"))
    if capture is not None:
        capture.test_id = ""
        if capture.dirty:
            _write(capture)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, object, None]:
    """The test's outcome, the worst of its phases: a failed setup or teardown is an
    error, a failed call a failure."""
    made = yield
    seen = item.config.stash.get(_OUTCOMES, None)
    report = made.get_result()  # type: ignore[attr-defined]
    if seen is None or not isinstance(report, pytest.TestReport):
        return
    now: Outcome | None = None
    if report.failed:
        now = "failed" if report.when == "call" else "error"
    elif report.skipped:
        now = "skipped"
    if now is not None and seen.get(item.nodeid) not in ("failed", "error"):
        seen[item.nodeid] = now


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
