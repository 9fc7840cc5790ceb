"""Which GPUs this machine lets kfbot use, found without importing torch.

    devices = visible_gpus()                  # e.g. [0, 1, 2, 3], or [2, 3] under
                                              # CUDA_VISIBLE_DEVICES=2,3
    chosen = choose_gpus("0,2", devices)      # the devices behind indices 0 and 2

Indices are the ones torch would show inside this process (0..n-1 over what is
visible); each chosen GPU comes back as the device number a worker is pinned to
through its own CUDA_VISIBLE_DEVICES. The parent never touches CUDA: a worker does,
one per GPU, so a GPU that dies takes only its worker with it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from kfbot.errors import KfbotError

_SMI_TIMEOUT_S = 30.0
_SMI_LINE = re.compile(r"GPU (\d+): ")  # MIG instances are indented under their GPU


def visible_gpus(env: Mapping[str, str] | None = None, smi_output: str | None = None
                 ) -> list[int]:
    """Device numbers of the GPUs visible to this process, in CUDA's index order.

    CUDA_VISIBLE_DEVICES, when set, decides (an empty value hides every GPU);
    otherwise `nvidia-smi -L` lists them. No driver, no GPU: an empty list.
    """
    environ = os.environ if env is None else env
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return _parse_visible(listed)
    text = smi_output if smi_output is not None else _nvidia_smi_list()
    return [int(m.group(1)) for m in map(_SMI_LINE.match, text.splitlines()) if m]


def _parse_visible(listed: str) -> list[int]:
    devices: list[int] = []
    for entry in (e.strip() for e in listed.split(",")):
        if not entry:
            continue
        if not entry.isdigit():
            # CUDA stops at the first entry it cannot read; UUIDs and MIG names cannot
            # be pinned one per worker here, so say so rather than guess.
            if entry.startswith(("GPU-", "MIG-")):
                raise KfbotError(f"CUDA_VISIBLE_DEVICES={listed}: kfbot needs GPU numbers "
                                 f"there, not UUIDs ({entry}), to run one worker per GPU")
            break
        devices.append(int(entry))
    return devices


def _nvidia_smi_list() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True,
                              timeout=_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def choose_gpus(text: str | None, devices: Sequence[int]) -> list[int]:
    """The devices behind `--gpus 0,2` (indices into `devices`); all of them for None."""
    if text is None:
        return list(devices)
    parts = [p.strip() for p in text.split(",")]
    wrong = next((p for p in parts if not p.isdigit()), None)
    if wrong is not None:
        raise KfbotError(f"--gpus {text}: {wrong!r} is not a GPU index "
                         f"(a comma-separated list such as --gpus 0,2)")
    chosen: list[int] = []
    for index in map(int, parts):
        if index >= len(devices):
            seen = ", ".join(str(i) for i in range(len(devices))) or "none"
            raise KfbotError(f"--gpus {text}: there is no GPU {index} here "
                             f"(visible GPU indices: {seen})")
        if devices[index] in chosen:
            raise KfbotError(f"--gpus {text}: GPU {index} is named twice")
        chosen.append(devices[index])
    return chosen
