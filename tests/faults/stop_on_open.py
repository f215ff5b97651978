"""Run the posttrain command line, and stop this process (SIGSTOP) when it opens a file whose path
contains every part of $STOP_ON_OPEN ("|"-separated) for writing, e.g.
".tmp-step_000002|trainer_state.json": the moment a checkpoint is half-written. The test then kills it with SIGKILL from outside.

Nothing in the run is replaced: an audit hook only watches `open` calls.
"""

from __future__ import annotations

import os
import signal
import sys

from posttrain.cli import main

PARTS = os.environ["STOP_ON_OPEN"].split("|")


def _stop_when_opening(event: str, args: tuple) -> None:
    if event != "open" or len(args) < 2 or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    if not isinstance(args[1], str) or not set(args[1]) & set("wax+"):
        return
    path = os.fsdecode(args[0])
    if all(part in path for part in PARTS):
        os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    # Ctrl-C as from a terminal, even when the test suite runs as a background job: a shell without
    # job control starts those with SIGINT ignored, the children inherit it and Python then installs
    # no KeyboardInterrupt handler (the SIGINT test failed that way under `nohup bash .ci/run &`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.addaudithook(_stop_when_opening)
    sys.exit(main(sys.argv[1:]))
