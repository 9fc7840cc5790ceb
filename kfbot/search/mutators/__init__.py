"""The mutators: what an island proposes from a parent, one module per mutator.

    rotation  the mutators together, in each island's own rotating order, and the
              feedback each evaluation gives the next proposal
    params    new values for the tunables the scan found (Kernel-Tuner style)
    reach     which tunables reach the kernel: the numbers `params` may change
    flags     nvcc flags that change speed and not results
    llm       the LLM mutator: SEARCH/REPLACE edits asked of Claude
    edits     the SEARCH/REPLACE format, parsed and applied
    (the rules mutator's rewrites are `search.rewrites`, a package of their own)

It may import `search.evolution` (the archive's individuals), `search.rewrites`,
`search.outcome` (the per-shape lines a prompt quotes), `search.budget`, the
evaluation's records and the ground floor; never `search.runner` or `search.executors`.
"""
