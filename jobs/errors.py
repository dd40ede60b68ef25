"""One root for every error eyrie raises on purpose: entry points catch `EyrieError` and print its
message (written for the user: it names the field, row, file or setting and what to do); anything
else is a bug and keeps its traceback."""

from __future__ import annotations


class EyrieError(Exception):
    """An error a user can act on; `exit_code` is what the CLI exits with when it ends a command."""

    exit_code: int = 1


class InputError(EyrieError):
    """Bad input caught before anything was paid: the CLI exits 2."""

    exit_code = 2
