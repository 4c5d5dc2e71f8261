"""A private PostgreSQL server for the tests: ``initdb`` in a temporary directory and
``postgres`` on a free port of 127.0.0.1, trust authentication, no durability (fsync off).
As root it runs as ``nobody``, since PostgreSQL refuses to run as root. Stopped (and its
directory removed) on exit; it never touches a server it did not start."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.redis_server import free_port


def find_bin_dir() -> Path:
    """Where ``initdb`` and ``postgres`` live: ``RATELIMIT_POSTGRES_BIN``, Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest first), or PATH."""
    chosen = os.environ.get("RATELIMIT_POSTGRES_BIN")
    if chosen:
        return Path(chosen)
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).parent
    raise FileNotFoundError(
        "no PostgreSQL server binaries (initdb, postgres): install Debian's postgresql package "
        "or set RATELIMIT_POSTGRES_BIN"
    )


class PostgresServer:
    def __init__(self, port: int | None = None) -> None:
        self.bin = find_bin_dir()
        self.port = port or free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._dir = Path(tempfile.mkdtemp(prefix="ratelimit-pg-"))
        self._user = "nobody" if os.geteuid() == 0 else None
        self._process: subprocess.Popen[bytes] | None = None

    def _run(self, *command: str) -> None:
        subprocess.run(
            command, check=True, capture_output=True, timeout=120, user=self._user, cwd=self._dir
        )

    def __enter__(self) -> PostgresServer:
        if self._user is not None:
            shutil.chown(self._dir, self._user)
        data = self._dir / "data"
        self._run(
            str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--no-sync", "--no-instructions",
        )  # fmt: skip
        settings = {
            "listen_addresses": "127.0.0.1",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        options = [part for name, value in settings.items() for part in ("-c", f"{name}={value}")]
        command = [str(self.bin / "postgres"), "-D", str(data), "-p", str(self.port)]
        self._process = subprocess.Popen(
            [*command, "-k", str(self._dir), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self._user,
            cwd=self._dir,
        )
        deadline = time.monotonic() + 60
        while not self._accepting():  # listening comes before accepting connections
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError("postgres did not start")
            time.sleep(0.05)  # the server is starting, not a window
        return self

    def _accepting(self) -> bool:
        """Whether the server accepts connections (``pg_isready``; without it, listens)."""
        ready = self.bin / "pg_isready"
        if ready.exists():
            command = [str(ready), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
            return subprocess.run(command, check=False, timeout=30).returncode == 0
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
