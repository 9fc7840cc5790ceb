"""The search for a faster kernel: islands of MAP-Elites archives, mutators, a budget,
run state that survives a kill, and the experience file later runs learn from."""
