"""Run an ASGI application under a real uvicorn process on a free port on 127.0.0.1, for the
HTTP tests and benchmarks; stopped (and only it) when done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent


class UvicornServer:
    """``uvicorn APP`` with ``--no-proxy-headers`` (uvicorn would otherwise believe
    ``X-Forwarded-For`` from 127.0.0.1, where the tests connect from) unless told otherwise.
    ``env``: variables added to the server's environment."""

    def __init__(
        self,
        app: str,
        env: dict[str, str] | None = None,
        factory: bool = False,
        proxy_headers: bool = False,
        extra: list[str] | None = None,
        ready_path: str = "/health",
    ) -> None:
        self.ready_path = ready_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable, "-m", "uvicorn", app,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--log-level", "warning", "--lifespan", "on",
            *(["--factory"] if factory else []),
            *([] if proxy_headers else ["--no-proxy-headers"]),
            *(extra or []),
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> UvicornServer:
        self.process = subprocess.Popen(
            self.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"uvicorn exited with {code}:\n{self.stop()}")
            try:
                httpx.get(self.url + self.ready_path, timeout=1.0)
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"uvicorn did not answer within {timeout} s")

    def stop(self) -> str:
        """Stop the server; return what it printed."""
        if self.process is None:
            return ""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        output = ""
        if self.process.stdout is not None:
            output = self.process.stdout.read().decode()
            self.process.stdout.close()
        self.process = None
        return output

    def __enter__(self) -> UvicornServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
