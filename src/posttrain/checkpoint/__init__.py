"""Atomic checkpoints in a run directory, retention, and resume."""

from posttrain.checkpoint.checkpointer import Checkpointer, resolve_resume

__all__ = ["Checkpointer", "resolve_resume"]
