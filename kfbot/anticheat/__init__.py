"""Anti-cheating: the layers that stop a candidate from faking a speedup.

Static rules read the candidate's source before anything is built; runtime probes
run in the worker beside verification and timing; a physics floor flags speedups
that no honest kernel can reach; an adequacy gate says whether the repository's own
test would notice a trivially wrong op. Every layer reports `Finding`s.

It holds checks only and sits below `kfbot.evaluate`, which runs them: it may import
the ground floor and the scan's tree-sitter helpers, nothing of `evaluate` or above.
"""
