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


class WorkerLostError(UserError):
    """A worker process (a Ray actor) died: killed, out of memory, or its node was lost.

    Nothing in the run's code failed, so there is no traceback to show; the run stops and the
    same command resumes it from the latest complete checkpoint.
    """

    def __init__(self, worker: str, reason: str, latest_checkpoint: str | None = None) -> None:
        self.worker, self.reason, self.latest_checkpoint = worker, reason, latest_checkpoint
        where = f"; latest complete checkpoint: {latest_checkpoint}" if latest_checkpoint else ""
        super().__init__(
            f"worker {worker} died ({reason}); the run stopped{where}. "
            "Re-run the same command to resume from the latest complete checkpoint."
        )

    def with_checkpoint(self, latest_checkpoint: object | None) -> WorkerLostError:
        """The same error naming the checkpoint a re-run resumes from ('none' before the first save)."""
        return WorkerLostError(self.worker, self.reason, str(latest_checkpoint or "none"))


class DiskFullError(UserError, OSError):
    """A checkpoint could not be written for lack of space; the previous checkpoint is intact."""
