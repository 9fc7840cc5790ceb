"""The inputs a candidate is judged on beyond the captured calls, and the contract
they make: every input kfbot adds is tried on the original first.

    fresh          inputs shaped like a recorded call; scaled, large and edge variants
    distributions  floating inputs redrawn from several distributions
    redrawn        kfbot's side of the redrawn inputs and of the precision kept
    contract       the original defines the contract: added inputs it fails leave it

It may import the capture's records (`kfbot.evaluate.capture.signature`), the
evaluation records and the worker's job results.
"""
