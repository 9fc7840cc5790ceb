"""What a run found, read for people: the winner and where its speedup holds.

    winner    which candidate a run commits
    pershape  the per-shape picture: captured or added shape, speedup, speed of light
    heldout   the committed candidate timed beyond the shapes it was chosen on
    dispatch  a size dispatch: the candidate where faster, the original where slower
    variants  the repository's own variants of the op, timed beside it
    report    the patch, the progress chart and the history a run leaves behind

It may import `search.evolution` (the archive's individuals), `search.rewrites`, the
evaluation's records and the ground floor; never the mutators, the executors or the
runner.
"""
