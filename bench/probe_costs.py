"""What each runtime probe costs on this GPU, one call at a time.

The overhead figure of `bench/anticheat.py` says how much slower the runtime checks make
an evaluation; this says which probe the time goes to, per output size:

* the timed-output check, once per timed trial: host time to queue it, GPU time to run it;
* the poisoning, twice per checked call: its whole cost, and the allocator snapshot
  within it, against how many free blocks the cache holds;
* the timing loop's stopping rule, once per trial (host only).

    python bench/probe_costs.py
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 24)  # float32 output elements
CALLS = 200


def _per_call(fn: Callable[[], object], calls: int = CALLS) -> tuple[float, float]:
    """(host µs to issue one call, GPU µs per call), the GPU kept busy meanwhile."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(2_000_000)  # about a millisecond: the host issues ahead of the GPU
    start.record()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) / calls * 1e6
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) * 1e3 / calls


def timed_check_rows() -> list[tuple[str, str, str]]:
    import torch

    from kfbot.evaluate.device.timed import timed_check
    from kfbot.evaluate.device.verify import Context

    rows = []
    for n in SIZES:
        want = torch.randn(n, device="cuda")
        got = want + 1e-7 * torch.randn(n, device="cuda")
        check = timed_check(Context({}, None))
        outputs = {"candidate": got, "original": want}
        check(outputs, 0)  # the full check, as on an argument set's first trial
        host, gpu = _per_call(lambda c=check, o=outputs: c(o, 0))
        rows.append((f"{n:,}", f"{host:.1f}", f"{gpu:.1f}"))
    return rows


def poison_rows() -> list[tuple[str, str, str, str]]:
    """Poisoning with the cache holding `k` free blocks of assorted sizes."""
    import torch

    from kfbot.evaluate.poison import POISON_NAN, _free_blocks, poison

    rows = []
    for blocks in (4, 32, 128):
        torch.cuda.empty_cache()
        rng = random.Random(blocks)
        kept = [torch.empty(rng.choice((1 << 12, 1 << 18, 1 << 22)), device="cuda")
                for _ in range(2 * blocks)]
        del kept[::2]  # every other one freed: that many free blocks between live ones
        poison(POISON_NAN, 1 << 24)
        began = time.perf_counter()
        for _ in range(50):
            poison(POISON_NAN, 1 << 24)
        whole = (time.perf_counter() - began) / 50 * 1e6
        began = time.perf_counter()
        for _ in range(50):
            free = _free_blocks()
        snap = (time.perf_counter() - began) / 50 * 1e6
        rows.append((str(blocks), str(len(free)), f"{whole:.0f}", f"{snap:.0f}"))
        del kept
    return rows


def stopping_rows() -> list[tuple[str, str, str]]:
    from kfbot.evaluate.device.timing import Running

    rows = []
    for n in (20, 100, 200):
        xs = [random.gauss(10.0, 0.3) for _ in range(n)]
        began = time.perf_counter()
        for _ in range(200):
            statistics.stdev(xs) / math.sqrt(n) / statistics.fmean(xs)
        exact = (time.perf_counter() - began) / 200 * 1e6
        running = Running()
        for x in xs:
            running.add(x)
        began = time.perf_counter()
        for _ in range(200):
            running.add(10.0)
            running.rse()
        rows.append((str(n), f"{exact:.1f}", f"{(time.perf_counter() - began) / 200 * 1e6:.2f}"))
    return rows


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def main() -> int:
    console = Console()
    console.print(_table("stopping rule, per op and trial (host µs)",
                         ("samples", "statistics.stdev", "running (Welford)"), stopping_rows()))
    import torch

    if not torch.cuda.is_available():
        console.print("no CUDA GPU: only the host-side rows above were measured")
        return 3
    console.print(f"GPU: {torch.cuda.get_device_name(0)}", highlight=False)
    console.print(_table("timed-output check, per trial (after the first on an argument set)",
                         ("output elements", "host µs", "GPU µs"), timed_check_rows()))
    console.print(_table("poisoning, per checked call", ("free blocks made", "free blocks seen",
                                                          "poison µs", "of which snapshot µs"),
                         poison_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
