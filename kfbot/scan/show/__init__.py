"""A scan report shown: for people (a table, Markdown) and for machines (JSON).

    render     the table, the Markdown and the versioned JSON of a report
    summary    what a scan means: how many kernels can be optimised, why not the rest
    explain    `kfbot scan --explain <kernel>`: how the scan reached it, or where it stopped
    json_text  `json.dumps(indent=n)` byte for byte at the speed of the C encoder

It may import the scan's `model` and `forked` and the ground floor; it reads records, never
sources, so nothing of `scan.cuda`, `scan.python` or `scan.link`.
"""
