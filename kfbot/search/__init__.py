"""The search for a faster kernel: islands of MAP-Elites archives, mutators, a budget,
run state that survives a kill, and the experience file later runs learn from.

It may import the evaluation (engine, candidates, records), the anti-cheating
adequacy gate, the scan's records and the ground floor; github and the commands sit
above it.
"""
