"""Everything kfbot does on GitHub: the REST client, pull requests, comment commands.

`api` is the one module that talks to PyGithub; the others build on it.

`action/` runs kfbot as the GitHub Action. It may import the search, evaluate,
anticheat, scan and the ground floor; only the commands import it.
"""
