"""Observed pairing: run the repository's tests on a GPU and watch which kernels each
one launches, through which ops, and whether it notices when a kernel writes nothing.

`protocol` is what the test processes and kfbot exchange, `recorder` runs inside the
test processes (it imports torch there), `names` reads the profiler's kernel names and
matches them to the scanned definitions, `mutants` makes the kernel that writes
nothing, `observer` runs it all; `kfbot.scan.observed` keeps the results in the
repository's `.kfbot/` and merges them into a scan.
"""
