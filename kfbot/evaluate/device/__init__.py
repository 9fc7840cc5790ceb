"""Code that runs inside the isolated GPU worker: the only place torch meets a candidate.

The jobs the worker runs by name (`kfbot.evaluate.worker`). They may import the
capture's records, the inputs, the reference, the verdict, the poison and the worker's
job results; nothing else of `kfbot.evaluate` imports them but by job name.
"""
