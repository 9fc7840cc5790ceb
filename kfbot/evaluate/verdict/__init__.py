"""The verdict on numbers: is an output right, and is a candidate faster.

    compare     correctness: an output against the expected one, and where it differs
    tolerances  how far a result may be from the expected one, per dtype
    stats       timing statistics: robust summaries and a bootstrap speedup test
    light       the speed of light: the least time a call can take on this GPU

Pure computation on values and records: no torch, no processes. It imports nothing
else of `kfbot.evaluate`.
"""
