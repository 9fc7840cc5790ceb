"""The search for a faster kernel: islands of MAP-Elites archives, mutators, a budget,
run state that survives a kill, and the experience file later runs learn from.

    runner      `kfbot optimize` for one kernel: the composition, top to bottom
    plan        a run's settings, what it will search and the time it keeps
    evolution/  the strategy: archives, islands, behaviour cells
    rewrites/   the rules mutator's library of source rewrites
    executors/  where evaluations run: this machine's GPUs or a Ray cluster
    outcome/    the winner and where its speedup holds
    mutators/   one module per mutator, and their rotation
    budget, stopping, progress, target, model, sections, runfolder, branch,
    experience, provenance   the run's own records and edges

It may import the evaluation (engine, candidates, records), the anti-cheating
adequacy gate, the scan's records and the ground floor; github and the commands sit
above it. Its sub-packages import one way, in the order listed above from evolution/
to mutators/ (`tests/test_house.py`).
"""
