"""Errors of the user's own making: a bad config, a missing file, a malformed data row.

The command line prints such an error's message as one line (`error: ...`) and exits with
status 2, without a traceback; every other exception is a bug and keeps its traceback.
`posttrain --debug ...` (or POSTTRAIN_DEBUG=1) shows the traceback of a user error too.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; the message says what is wrong, where, and what to change."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder that the user named (a dataset, a checkpoint) does not exist or is incomplete."""


class ExistingFileError(UserError, FileExistsError):
    """An output path that the user named exists already and would be overwritten."""
