"""kfbot: makes the CUDA kernels in a repository faster and proves it.

The modules directly under `kfbot/` are the ground floor (errors, records, config,
paths, text): they import nothing of the packages. Above them, lowest first: scan,
anticheat, evaluate, search, github, commands, and the entry point `cli`
(`docs/architecture.md`).
"""

__version__ = "0.1.0"
