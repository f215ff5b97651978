"""Loopback OpenEnv servers for the tests: `posttrain env serve` in a subprocess, any ASGI app in a thread.

Every server listens on 127.0.0.1 and a free port, and is shut down by its context manager."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 120.0, process: subprocess.Popen | None = None) -> None:
    """Poll `GET url/health` until it answers 200; fails when `process` exits or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {process.stderr.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url}/health did not answer within {timeout_s}s")


def start_cli_server(args: list[str], port: int) -> subprocess.Popen:
    """`posttrain env serve ARGS --port port` started (not yet healthy), in its own process group."""
    command = [sys.executable, "-m", "posttrain.cli", "env", "serve", *args, "--port", str(port)]
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def kill(process: subprocess.Popen) -> None:
    """SIGKILL the server's process group and reap it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    if process.stderr is not None:
        process.stderr.close()


@contextlib.contextmanager
def cli_server(args: list[str], port: int | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """(url, process) of a healthy `posttrain env serve` subprocess; killed on exit."""
    port = port or free_port()
    process = start_cli_server(args, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process=process)
        yield url, process
    finally:
        kill(process)


@contextlib.contextmanager
def thread_server(app: Any) -> Iterator[str]:
    """The url of `app` served by uvicorn in a thread of this process; stopped on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=60)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
