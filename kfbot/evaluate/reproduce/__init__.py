"""Reproduction: a run's reported speedup measured again from its committed patch alone.

    model       what a reproduction is asked, and what it found (plain values, read by
                the pull request body and the publisher without the engine)
    remeasure   the patch applied to a clean copy of the base, both built and timed
                with the second timing path

`remeasure` drives the engine; `model` imports only records.
"""
