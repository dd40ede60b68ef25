"""The two ways a source fails: as a whole (`SourceError`: it cannot be opened or is corrupt as a whole, and
the run stops before paying) or one row at a time (`RowError`: the reader turns it into a `BadRow`)."""

from __future__ import annotations

from eyrie.jobs.errors import EyrieError


class SourceError(EyrieError, RuntimeError):
    """A source that cannot be read at all (missing, unreadable, unsupported); names source and URI."""


class RowError(EyrieError, ValueError):
    """A row-level problem, turned into a BadRow by the reader; never leaves the `sources` package."""
