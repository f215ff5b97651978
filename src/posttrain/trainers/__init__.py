"""Training loops, one file per algorithm."""
