"""Everything kfbot does on GitHub: the REST client, pull requests, comment commands.

`api` is the one module that talks to PyGithub; the others build on it.
"""
