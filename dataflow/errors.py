"""The base classes of errors a user can cause (a declared leaf module: it imports nothing from
`dataflow`).

`UserError` is bad input: a wrong flag value, a malformed format string, an impossible
architecture, a DFG that does not fit. The CLI prints it as one line and exits with code 2.
Anything else that escapes is a bug in dataflow: the CLI prints its traceback and asks for a
report. `UserError` subclasses `ValueError`, so callers that caught `ValueError` keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user (a parameter, a file, a format string)."""


class KeyPathError(UserError):
    """Bad input read from a file: `source` is the file, `key_path` the dotted key in it. The
    message starts with both, so one line tells the user where to look."""

    def __init__(self, source: str, key_path: str, message: str):
        self.source = source
        self.key_path = key_path
        where = f"{source}: " if source else ""
        at = f"{key_path}: " if key_path else ""
        super().__init__(f"{where}{at}{message}")


#: What the CLI reports as one line and exit code 2: bad input, and a file the user named that
#: cannot be opened. Anything else is a bug: a traceback and a request to report it.
USER_ERRORS: tuple[type[Exception], ...] = (UserError, FileNotFoundError, IsADirectoryError,
                                            NotADirectoryError, PermissionError)
