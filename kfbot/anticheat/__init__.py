"""Anti-cheating: the layers that stop a candidate from faking a speedup.

Static rules read the candidate's source before anything is built; runtime probes
run in the worker beside verification and timing; a physics floor flags speedups
that no honest kernel can reach; an adequacy gate says whether the repository's own
test would notice a trivially wrong op. Every layer reports `Finding`s.
"""
