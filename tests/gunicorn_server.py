"""Run a WSGI application under a real gunicorn (gthread workers) on a free port on
127.0.0.1, for the Flask and Django tests and benchmarks; stopped (and only it) when done."""

from __future__ import annotations

import os
import sys

from tests.http_server import UvicornServer
from tests.redis_server import free_port


class GunicornServer(UvicornServer):
    """``gunicorn APP`` with ``workers`` processes of ``threads`` threads each. ``env``:
    variables added to the server's environment; ``extra``: more arguments."""

    def __init__(
        self,
        app: str,
        env: dict[str, str] | None = None,
        workers: int = 1,
        threads: int = 8,
        extra: list[str] | None = None,
        ready_path: str = "/health",
    ) -> None:
        self.ready_path = ready_path
        self.uds = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable, "-m", "gunicorn", app,
            "--bind", f"127.0.0.1:{self.port}",
            "--worker-class", "gthread", "--workers", str(workers), "--threads", str(threads),
            "--log-level", "warning", "--graceful-timeout", "5",
            *(extra or []),
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.process = None
