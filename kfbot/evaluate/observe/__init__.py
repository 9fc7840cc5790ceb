"""Observed pairing: run the repository's tests on a GPU and watch which kernels each
one launches, through which ops, and whether it notices when a kernel writes nothing.

What runs inside the test processes belongs to the capture, which hosts it:
`kfbot.evaluate.capture.launches` (what the processes and kfbot exchange) and
`kfbot.evaluate.capture.launch_recorder` (it imports torch there). Here, `names`
reads the profiler's kernel names and matches them to the scanned definitions,
`mutants` makes the kernel that writes nothing, `observer` runs it all;
`kfbot.scan.observed` keeps the results in the repository's `.kfbot/` and merges them
into a scan.

It may import the build, the capture and the scan's records; nothing below imports it.
"""
