"""The worker session: every way a job fails is a value, and the session recovers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kfbot.errors import KfbotError
from kfbot.evaluate.sandbox import sandbox
from kfbot.evaluate.worker.session import (
    DEFAULT_TAIL_BYTES,
    JobResult,
    WorkerSession,
    cuda_error_kind,
    run_job,
)

TESTS_DIR = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
TIMEOUT_S = 1.0  # what a job that hangs is given
SLACK_S = 10.0  # what a job that finishes is given: generous for a loaded machine


def job(name: str) -> str:
    return f"worker_jobs:{name}"


@pytest.fixture
def session() -> Iterator[WorkerSession]:
    with WorkerSession(python_path=[TESTS_DIR], output_cap_bytes=MIB) as live:
        yield live


def call(session: WorkerSession, name: str, **payload: object) -> JobResult:
    timeout_s = TIMEOUT_S if name == "spin" else SLACK_S
    return session.call(job(name), payload, timeout_s)


def child_id(session: WorkerSession) -> str:
    """Which process runs the session's jobs now."""
    result = call(session, "pid")
    assert result.status == "ok", result.reason
    assert result.value is not None
    return str(result.value["boot"])


def child_pid(session: WorkerSession) -> int:
    """The pid of the process that runs the session's jobs, as this process sees it."""
    result = call(session, "pid")
    assert result.status == "ok", result.reason
    assert result.value is not None
    return host_pid(session, int(result.value["pid"]))


def host_pid(session: WorkerSession, inner: int) -> int:
    """The pid this process sees for `inner`, a pid inside the session's sandbox (the
    same number where there is none)."""
    assert session.pid is not None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        spaces = next((line.split()[1:] for line in status.splitlines()
                       if line.startswith("NSpid:")), [])
        if len(spaces) > 1 and spaces[-1] == str(inner) and \
                descends(int(entry.name), session.pid):
            return int(entry.name)
    assert descends(inner, session.pid), f"pid {inner} is not in the session's tree"
    return inner


def descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already died


def gone_soon(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_ok_jobs_reuse_one_process(session: WorkerSession) -> None:
    first = child_id(session)
    result = call(session, "add", a=2, b=3)
    assert (result.status, result.kind, result.value) == ("ok", "ok", {"sum": 5})
    assert result.diagnostic() is None
    assert result.reason.startswith("finished in")
    assert child_id(session) == first
    assert descends(child_pid(session), session.pid or -1)


# name, status, kind, part of the reason, whether the process must be replaced
FAULTS = [
    ("segfault", "crashed", "segfault", "worker died with SIGSEGV", True),
    ("abort", "crashed", "abort", "worker died with SIGABRT", True),
    ("kill_self", "crashed", "killed", "worker died with SIGKILL", True),
    ("exit_code", "crashed", "exited", "exited with code 3", True),
    ("assert_then_abort", "crashed", "device_assert", "SIGABRT after a CUDA error", True),
    ("raise_illegal_address", "error", "illegal_address", "illegal memory access", True),
    ("raise_oom", "error", "oom", "RuntimeError: CUDA out of memory", True),
    ("spin", "timeout", "timeout", "killed after 1.0 s timeout", True),
    ("flood", "output_flood", "output_flood", "more than 1.0 MiB", True),
    ("raise_value_error", "error", "exception", "ValueError: bad input 0", False),
    ("not_a_dict", "error", "bad_result", "job returned list", False),
    ("not_json", "error", "bad_result", "not JSON serializable", False),
    ("no_such_job", "error", "bad_ref", "has no attribute 'no_such_job'", False),
]


@pytest.mark.parametrize(("name", "status", "kind", "reason", "replaced"), FAULTS)
def test_fault_is_recorded_and_next_job_succeeds(
    session: WorkerSession, name: str, status: str, kind: str, reason: str, replaced: bool
) -> None:
    before = child_id(session)
    result = call(session, name)
    assert (result.status, result.kind, result.value) == (status, kind, None)
    assert reason in result.reason
    assert len(result.output_tail) <= DEFAULT_TAIL_BYTES
    diagnostic = result.diagnostic()
    assert diagnostic is not None
    assert (diagnostic.stage, diagnostic.kind) == ("runtime", kind)
    assert diagnostic.message == result.reason
    # A replaced process is gone at once, so a dead CUDA context holds no memory.
    assert (session.pid is None) == replaced
    after = child_id(session)
    assert (after != before) == replaced


def test_timeout_returns_promptly(session: WorkerSession) -> None:
    spinner = child_pid(session)
    started = time.monotonic()
    result = call(session, "spin")
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert TIMEOUT_S <= result.duration_s <= elapsed < TIMEOUT_S + 2.0
    assert gone_soon(spinner)


def test_exception_keeps_type_message_and_job_frames(session: WorkerSession) -> None:
    result = call(session, "raise_value_error", n=7)
    assert result.reason == "ValueError: bad input 7"
    assert "in raise_value_error" in result.traceback
    assert "worker/main.py" not in result.traceback  # only the job's own frames
    diagnostic = result.diagnostic()
    assert diagnostic is not None
    assert ("traceback", result.traceback) in diagnostic.details


def test_job_can_ask_for_a_fresh_process(session: WorkerSession) -> None:
    result = call(session, "ask_restart")
    assert result.status == "ok"
    assert result.value is not None
    assert set(result.value) == {"boot"}  # the request to restart is not part of the value
    assert child_id(session) != result.value["boot"]


def test_child_killed_between_jobs_is_replaced(session: WorkerSession) -> None:
    first = child_id(session)
    os.kill(child_pid(session), signal.SIGKILL)
    time.sleep(0.1)
    assert child_id(session) != first


SECRETS = ["GITHUB_TOKEN", "ANTHROPIC_API_KEY", "MY_SECRET", "X_API_KEY", "SOME_PASSWORD",
           "GH_PAT", "PIP_INDEX_URL", "CI_JOB_JWT", "GIT_CONFIG_VALUE_0", "AWS_PROFILE"]


def test_secrets_never_reach_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRETS:
        monkeypatch.setenv(name, "s3cr3t-value")
    extras = {"KFBOT_EXTRA": "kept", "EXTRA_AUTH_HEADER": "s3cr3t-value"}
    with WorkerSession(python_path=[TESTS_DIR], gpu=3, env=extras) as live:
        result = call(live, "env_keys")
    assert result.status == "ok", result.reason
    assert result.value is not None
    env = result.value["env"]
    assert not {*SECRETS, "EXTRA_AUTH_HEADER"} & set(env)
    assert "s3cr3t-value" not in env.values()
    assert env["PATH"] == os.environ["PATH"]
    assert env["KFBOT_EXTRA"] == "kept"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(TESTS_DIR)


def test_printed_answers_do_not_confuse_the_channel(session: WorkerSession) -> None:
    first = child_id(session)
    result = call(session, "noisy")
    assert (result.status, result.value) == ("ok", {"real": True})
    assert '{"type": "result", "value": {"fake": true}}' in result.output_tail
    assert "raw stdout marker" in result.output_tail
    assert child_id(session) == first


def test_output_tail_is_per_job(session: WorkerSession) -> None:
    call(session, "noisy")
    assert call(session, "add", a=1, b=1).output_tail == ""


def test_large_payload_and_result_cross_the_pipes(session: WorkerSession) -> None:
    blob = "y" * (3 * MIB)  # far over a pipe's buffer in both directions
    result = call(session, "echo", blob=blob)
    assert result.value == {"echo": {"blob": blob}}


def test_startup_failure_is_reported_not_hung(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "kfbot").mkdir(parents=True)
    (broken / "kfbot" / "__init__.py").write_text(
        "raise ImportError('kfbot broken on purpose')\n"
    )
    with WorkerSession(python_path=[broken], startup_timeout_s=20.0) as live:
        for _ in range(2):  # and stays reported, rather than wedging the session
            started = time.monotonic()
            result = live.call(job("echo"), {}, TIMEOUT_S)
            assert time.monotonic() - started < 10.0
            assert (result.status, result.kind) == ("crashed", "startup")
            assert "ImportError: kfbot broken on purpose" in result.reason
            assert "exit code 1" in result.reason


def test_the_working_directory_cannot_replace_kfbot(tmp_path: Path) -> None:
    """The worker runs in the repository; a repository's `kfbot/` must not be imported."""
    (tmp_path / "kfbot").mkdir()
    (tmp_path / "kfbot" / "__init__.py").write_text("raise SystemExit('planted kfbot ran')\n")
    (tmp_path / "torch.py").write_text("raise SystemExit('planted torch ran')\n")
    with WorkerSession(cwd=tmp_path, python_path=[TESTS_DIR], startup_timeout_s=20.0) as live:
        result = call(live, "add", a=1, b=2)
    assert result.status == "ok", result.reason


def test_slow_startup_times_out(tmp_path: Path) -> None:
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(60)\n")
    with WorkerSession(
        python_path=[tmp_path], preload=["slow_import"], startup_timeout_s=0.5
    ) as live:
        started = time.monotonic()
        result = live.call(job("echo"), {}, TIMEOUT_S)
    assert time.monotonic() - started < 3.0
    assert (result.status, result.kind) == ("crashed", "startup")
    assert "no answer within 0.5 s" in result.reason


def test_missing_interpreter_is_a_startup_failure() -> None:
    with WorkerSession(python="/nonexistent/python3") as live:
        result = live.call(job("echo"), {}, TIMEOUT_S)
    assert (result.status, result.kind) == ("crashed", "startup")
    assert "cannot run /nonexistent/python3" in result.reason


def test_processes_a_job_starts_die_with_the_session() -> None:
    with WorkerSession(python_path=[TESTS_DIR]) as live:
        result = call(live, "start_sleeper")
        assert result.value is not None
        sleeper = host_pid(live, result.value["pid"])
        assert alive(sleeper)
    assert gone_soon(sleeper)


def test_run_job_is_a_one_shot_session() -> None:
    result = run_job(job("echo"), {"a": [1, 2]}, 5.0, python_path=[TESTS_DIR])
    assert (result.status, result.value) == ("ok", {"echo": {"a": [1, 2]}})


def test_caller_mistakes_raise(session: WorkerSession) -> None:
    with pytest.raises(KfbotError, match="not JSON-able"):
        session.call(job("echo"), {"x": object()}, TIMEOUT_S)
    with pytest.raises(KfbotError, match="must be positive"):
        session.call(job("echo"), {}, 0)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("CUDA error: an illegal memory access was encountered", "illegal_address"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "oom"),
        ("CUDA error: unspecified launch failure", "launch_failure"),
        ("CUDA error: misaligned address", "misaligned_address"),
        ("CUDA error: device-side assert triggered", "device_assert"),
        ("ValueError: shapes differ", None),
    ],
)
def test_cuda_error_kind(text: str, kind: str | None) -> None:
    assert cuda_error_kind(text) == kind


def test_a_profile_folder_gets_one_profile_per_job(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import pstats

    monkeypatch.setenv("KFBOT_WORKER_PROFILE", str(tmp_path))
    result = run_job(job("echo"), {"a": [1, 2]}, 5.0, python_path=[TESTS_DIR])
    assert result.ok
    (profile,) = tmp_path.glob("*.prof")
    names = {func[2] for func in pstats.Stats(str(profile)).stats}  # type: ignore[attr-defined]
    assert "echo" in names


def test_the_worker_reads_the_folders_it_is_shown(tmp_path: Path) -> None:
    """The builds a job loads lie in kfbot's cache, which a sandbox hides under /tmp unless
    the session names it (as the engine names its build cache)."""
    build = tmp_path / "cache" / "artifacts" / "ext.txt"
    build.parent.mkdir(parents=True)
    build.write_text("built")
    with WorkerSession(python_path=[TESTS_DIR], readable=[tmp_path / "cache"]) as live:
        result = live.call(job("read_file"), {"path": str(build)}, SLACK_S)
    assert (result.status, result.value) == ("ok", {"text": "built"}), result.reason
    if sandbox().available:  # (unsandboxed, every path can be read anyway)
        with WorkerSession(python_path=[TESTS_DIR]) as live:
            hidden = live.call(job("read_file"), {"path": str(build)}, SLACK_S)
        assert hidden.status == "error" and "No such file" in hidden.reason, hidden.reason


def test_the_worker_writes_only_the_folders_it_is_given(tmp_path: Path) -> None:
    """As the clean room's folder is given to the candidate's worker, and nothing else."""
    given, other = tmp_path / "clean-room", Path(__file__).parent / "planted-by-a-job.txt"
    given.mkdir()
    with WorkerSession(python_path=[TESTS_DIR], writable=[given]) as live:
        saved = live.call(job("write_file"), {"path": str(given / "0.pt")}, SLACK_S)
        planted = live.call(job("write_file"), {"path": str(other)}, SLACK_S)
    assert saved.ok and (given / "0.pt").read_text() == "saved", saved.reason
    if sandbox().available:  # (unsandboxed, it writes wherever its user may)
        assert not planted.ok and "Read-only file system" in planted.reason
        assert not other.exists()
    other.unlink(missing_ok=True)
