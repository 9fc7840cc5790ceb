"""The baseline: the original must pass its own reference before any candidate is
judged, and every step of getting there is reported with what would fix it.

    steps          the steps, their records, the `kfbot.yaml` snippets that fix them
    machine        what this machine must have, checked before the build
    preparation    the CPU side: the original's build, its staging, the capture
    step_reports   each step's report, made from what that step produced
    unready        the steps for a kernel kfbot cannot make a task of

It may import the build, the capture and the evaluation records.
"""
