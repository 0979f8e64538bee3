"""Local servers: a free port to start one on, and waiting until it answers."""

from __future__ import annotations

import socket
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def wait_healthy(url: str, timeout: float, what: str, alive=lambda: True) -> None:
    """Poll `url` until it answers 200; raise when `alive()` turns false or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(url):
            return
        if not alive():
            raise RuntimeError(f"{what} exited")
        time.sleep(1)
    raise TimeoutError(f"{what}: {url} not healthy within {timeout:.0f} s")
