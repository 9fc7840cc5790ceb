"""The one user-facing exception and the exit codes the CLI maps it to."""

from __future__ import annotations

# Exit codes: 0 ok, 1 the command ran and found a failure, 2 bad usage or input,
# 3 a needed tool or device is missing.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_MISSING_TOOL = 3


class KfbotError(Exception):
    """A problem a person can act on: the message says what and where."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
