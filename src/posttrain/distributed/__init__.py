"""Worker groups on a Ray virtual cluster, and an in-process executor with the same interface."""
