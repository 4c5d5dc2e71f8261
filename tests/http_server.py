"""Run an ASGI application under a real uvicorn process on a free port on 127.0.0.1, for the
HTTP tests and benchmarks; stopped (and only it) when done."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import httpx

from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def _listening(path: str) -> bool:
    """A server accepts connections on the unix socket ``path`` (probed with a socket of
    our own, closed either way: httpx's transport leaves one open when connecting fails)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


class UvicornServer:
    """``uvicorn APP`` with ``--no-proxy-headers`` (uvicorn would otherwise believe
    ``X-Forwarded-For`` from 127.0.0.1, where the tests connect from) unless told otherwise.
    ``env``: variables added to the server's environment. ``uds``: a unix socket's path to
    serve on (``--uds``) instead of a TCP port; :meth:`client` speaks to either."""

    def __init__(
        self,
        app: str,
        env: dict[str, str] | None = None,
        factory: bool = False,
        proxy_headers: bool = False,
        extra: list[str] | None = None,
        ready_path: str = "/health",
        uds: str | None = None,
    ) -> None:
        self.ready_path = ready_path
        self.uds = uds
        self.port = free_port()
        # over a unix socket the host in the URL is only the Host header
        self.url = "http://localhost" if uds else f"http://127.0.0.1:{self.port}"
        where = ["--uds", uds] if uds else ["--host", "127.0.0.1", "--port", str(self.port)]
        self.command = [
            sys.executable, "-m", "uvicorn", app, *where,
            "--log-level", "warning", "--lifespan", "on",
            *(["--factory"] if factory else []),
            *([] if proxy_headers else ["--no-proxy-headers"]),
            *(extra or []),
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Self:
        self.process = subprocess.Popen(
            self.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"{self.command[2]} exited with {code}:\n{self.stop()}")
            try:
                if self.uds and not _listening(self.uds):
                    raise httpx.ConnectError("not listening yet")
                with self.sync_client(timeout=1.0) as http:
                    http.get(self.ready_path)
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.command[2]} did not answer within {timeout} s")

    def client(self, **options: Any) -> httpx.AsyncClient:
        """An httpx client for this server (over its unix socket when it has one)."""
        transport = httpx.AsyncHTTPTransport(uds=self.uds) if self.uds else None
        return httpx.AsyncClient(base_url=self.url, transport=transport, **options)

    def sync_client(self, **options: Any) -> httpx.Client:
        """:meth:`client`, synchronous."""
        transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
        return httpx.Client(base_url=self.url, transport=transport, **options)

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
