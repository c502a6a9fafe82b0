"""What the Python bench scripts share: a free loopback port, and polling until a server answers."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from typing import Callable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 10 s, and the exit reaped."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(
    check: Callable[[], object], what: str, errors: tuple[type[BaseException], ...] = (OSError,), deadline_s: float = 20.0
) -> None:
    """Polls `check` until it returns something true; `errors` raised meanwhile count as not yet."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except errors:
            pass
        time.sleep(0.02)
    raise SystemExit(f"{what} did not come up")
