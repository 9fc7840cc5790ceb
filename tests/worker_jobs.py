"""CPU stand-ins for the jobs a worker runs: each misbehaves the way a kernel can.

The tests import these by reference ("worker_jobs:echo") inside the worker child, with
this directory on its PYTHONPATH; they are plain functions of a JSON-able dict.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

Payload = dict[str, Any]
# Which process answered: a pid alone cannot tell, since a sandboxed worker is PID 2 of
# its own namespace each time.
BOOT = f"{os.getpid()}-{os.urandom(6).hex()}"


def echo(payload: Payload) -> Payload:
    return {"echo": payload}


def add(payload: Payload) -> Payload:
    return {"sum": payload["a"] + payload["b"]}


def pid(payload: Payload) -> Payload:
    return {"pid": os.getpid(), "boot": BOOT}


def spin(payload: Payload) -> Payload:
    while True:  # a kernel that never finishes
        pass


def segfault(payload: Payload) -> Payload:
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    return {}


def abort(payload: Payload) -> Payload:
    os.abort()


def kill_self(payload: Payload) -> Payload:
    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
    return {}


def exit_code(payload: Payload) -> Payload:
    os._exit(int(payload.get("code", 3)))


def raise_value_error(payload: Payload) -> Payload:
    raise ValueError(f"bad input {payload.get('n', 0)}")


def raise_illegal_address(payload: Payload) -> Payload:
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def raise_oom(payload: Payload) -> Payload:
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


def assert_then_abort(payload: Payload) -> Payload:
    """A device-side assert: the message reaches stderr, then the process aborts."""
    os.write(2, b"../csrc/k.cu:12: block: [0,0,0]: Assertion failed.\n")
    os.write(2, b"CUDA error: device-side assert triggered\n")
    os.abort()


def ask_restart(payload: Payload) -> Payload:
    """A job that caught a sticky error itself and asks for a fresh process."""
    return {"boot": BOOT, "_restart_worker": True}


def not_a_dict(payload: Payload) -> list[int]:
    return [1, 2, 3]


def not_json(payload: Payload) -> Payload:
    return {"x": object()}


def flood(payload: Payload) -> Payload:
    line = "x" * (1024 * 1024)
    while True:
        print(line)


def noisy(payload: Payload) -> Payload:
    """Everything that could pass for a result, on stdout, stderr and their raw fds."""
    fake = json.dumps({"type": "result", "value": {"fake": True}})
    fake_frame = len(fake).to_bytes(8, "big") + fake.encode()
    print(fake)
    print(fake, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, fake_frame)
    os.write(2, fake_frame)
    os.write(1, b"\nraw stdout marker\n")
    return {"real": True}


def env_keys(payload: Payload) -> Payload:
    return {"keys": sorted(os.environ), "env": dict(os.environ)}


def start_sleeper(payload: Payload) -> Payload:
    """Leaves a grandchild running, which must not outlive the session."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return {"pid": proc.pid}


def sleep(payload: Payload) -> Payload:
    time.sleep(float(payload["seconds"]))
    return {"slept": payload["seconds"]}


def read_file(payload: Payload) -> Payload:
    """What a candidate's job does with the builds it is handed: read them by path."""
    with open(payload["path"]) as f:
        return {"text": f.read()}


def redrawn_bits(payload: Payload) -> Payload:
    """The bits of every redrawn trial's tensors on the GPU, as integer sums: two
    processes must draw the same inputs from the same seed (the clean room relies on it)."""
    import torch

    from kfbot.evaluate.device.values import values_for
    from kfbot.evaluate.inputs.contract import Trial

    sums = []
    for data in payload["trials"]:
        args, _ = values_for(Trial.from_json(data), int(payload["seed"]), "cuda")
        for t in args:
            if isinstance(t, torch.Tensor):
                sums.append(int(t.contiguous().view(torch.int32).to(torch.int64).sum()))
    return {"sums": sums}


def leave_a_fault(payload: Payload) -> Payload:
    """An out-of-range gather launched and not waited for: the device-side assert
    surfaces in whatever comes next in this process."""
    import torch

    x = torch.zeros(4, device="cuda")
    x[torch.tensor([1 << 20], device="cuda")]  # launched for its fault, never read
    return {"left": True}


def write_file(payload: Payload) -> Payload:
    """What a candidate's worker does for the clean room: save outputs by path."""
    with open(payload["path"], "w") as f:
        f.write("saved")
    return {"written": True}
