"""Where evaluations run: the seam between the search and the GPUs.

    local  the `Executor` Protocol and its local implementations: one engine, one
           engine per GPU of this machine, and a replay of recorded evaluations
    ray    evaluations on Ray actors, one GPU each, on any node of a cluster
    gpus   which GPUs this machine lets kfbot use, found without importing torch

It may import the evaluation engine and its records and the ground floor; nothing
else of the search (the search hands it candidates, it hands back evaluations).
"""
