"""What one candidate can do to the judging of itself and of the next, and the answers.

- **A broken device for the next job.** Every evaluate job first checks that the device
  works (`device.health`); one that finds it broken, or dies of a CUDA error in a
  worker the job before used, is run again in a fresh worker, and when that run is
  clean the candidate of the job before is named (`broken-context`): work it left
  running faulted after its job. `settle` gives the last candidate of a session the
  same look, after a pause.
- **A process it could tamper with.** The candidate's worker judges it, but everything
  in that process is within the candidate's reach. So its outputs on a few input sets
  are also judged in the clean room (`device.cleanroom`): a second worker, started by
  this process, that never loads a candidate, makes the inputs again and computes the
  reference and the original there.

This module never imports torch.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kfbot.anticheat.findings import Finding
from kfbot.evaluate.worker.session import CUDA_KINDS, JobResult, WorkerSession

JOBS = "kfbot.evaluate.device.jobs"
CLEAN_ROOM_JOB = "kfbot.evaluate.device.cleanroom:judge"
# What the judge needs of an evaluate payload: never the candidate.
JUDGE_KEYS = ("op", "original", "references", "tolerances", "sys_path")


class Isolation:
    """The judge worker and what the device said between jobs (mutable: live state)."""

    def __init__(self, make_session: Callable[[], WorkerSession], folder: Path,
                 timeout_s: float) -> None:
        self._make_session = make_session
        self._judge: WorkerSession | None = None
        self.folder = folder
        self.timeout_s = timeout_s
        self.broke_context: dict[str, str] = {}  # candidate hash -> what the next job saw
        self._last_job: str | None = None
        self._last_pid: int | None = None  # the worker the last job ran in

    def close(self) -> None:
        if self._judge is not None:
            self._judge.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- the device between jobs -------------------------------------------------------

    def evaluate_job(self, session: WorkerSession, digest: str, payload: Mapping[str, Any]
                     ) -> JobResult:
        """The evaluate job, run again in a fresh worker when it finds the device broken
        at its start, or dies of a CUDA error in a worker an earlier job used: work that
        job left running may have faulted during this one. When the second run is
        clean, the earlier job's candidate is named, not this one."""
        shared = session.pid is not None and session.pid == self._last_pid
        job = session.call(f"{JOBS}:evaluate", payload, timeout_s=self.timeout_s)
        stale = job.value.get("stale") if job.ok and job.value is not None else None
        if stale is not None or (shared and job.kind in CUDA_KINDS):
            again = session.call(f"{JOBS}:evaluate", payload, timeout_s=self.timeout_s)
            if self._last_job is not None and (stale is not None or again.ok):
                self.broke_context[self._last_job] = str(stale) if stale is not None else (
                    f"the next candidate's job died of a CUDA error ({job.reason}) in the "
                    "worker it had used, and passed in a fresh one")
            job = again
        self._last_job, self._last_pid = digest, session.pid
        return job

    def settle(self, session: WorkerSession | None, pause_s: float = 5.0) -> None:
        """After the last candidate: give work it left running `pause_s` to surface, then
        check the device, so the last candidate is named as any other would be."""
        if session is None or self._last_job is None:
            return
        time.sleep(pause_s)
        job = session.call(f"{JOBS}:device_health", {}, timeout_s=self.timeout_s)
        stale = job.value.get("stale") if job.ok and job.value is not None else job.reason
        if stale:
            self.broke_context[self._last_job] = str(stale)
        self._last_job = None

    def context_finding(self, digest: str) -> Finding | None:
        """A strict finding for a candidate that left the device broken after its job."""
        why = self.broke_context.get(digest)
        if why is None:
            return None
        return Finding("broken-context", "runtime", "strict",
                       "the worker's device was broken after this candidate's job ended, "
                       "before the next job began (work it left running faulted later)", why)

    # --- the clean room ----------------------------------------------------------------

    def outputs_folder(self, digest: str) -> str:
        """Where the candidate's worker writes the outputs the clean room reads."""
        return str(self.folder / digest[:16])

    def judge_saved(self, payload: Mapping[str, Any], value: dict[str, Any]) -> float:
        """The clean room's records on the outputs the evaluate job saved, added to its
        verification records; the seconds it took."""
        started = time.monotonic()
        if value.get("saved"):
            value["verify"] = [*value.get("verify", []),
                               *self.clean_room(payload, value["saved"])]
        return time.monotonic() - started

    def clean_room(self, payload: Mapping[str, Any], saved: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
        """The clean room's records on the saved outputs; one failed record when the judge
        itself could not run (the candidate is not passed on a check that did not run)."""
        if self._judge is None:
            self._judge = self._make_session()
        job = self._judge.call(CLEAN_ROOM_JOB, {**{k: payload[k] for k in JUDGE_KEYS},
                                                "saved": saved}, timeout_s=self.timeout_s)
        for entry in saved:
            Path(entry["file"]).unlink(missing_ok=True)
        if job.ok and job.value is not None:
            return list(job.value.get("records", []))
        return [{"input": "the clean room", "against": "reference", "passed": False,
                 "check": "clean-room", "comparisons": [], "run": "",
                 "error": f"the clean room's worker failed: {job.reason}"}]
