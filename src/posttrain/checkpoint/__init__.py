"""Atomic checkpoints in a run directory, retention, resume, and export to a Hugging Face folder."""

from posttrain.checkpoint.checkpointer import (
    Checkpointer,
    CheckpointInfo,
    Deadline,
    resolve_resume,
    select_retained,
)

__all__ = ["CheckpointInfo", "Checkpointer", "Deadline", "resolve_resume", "select_retained"]
