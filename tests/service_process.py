"""Run ``python -m ratelimit serve`` as a process on a free port on 127.0.0.1, for the service
tests, and stop it (and only it) when done."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class ServiceProcess:
    """The service, configured by ``env`` (``RATELIMIT_*``) on top of this environment."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, "RATELIMIT_HOST": "127.0.0.1", "RATELIMIT_PORT": "0"}
        self.env["RATELIMIT_METRICS_PORT"] = "0"  # never a fixed port
        self.env.update(env or {})
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServiceProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ratelimit", "serve"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = re.search(r"serving on [\d.]+:(\d+)", line)
                if found:
                    self.port = int(found.group(1))
                    return self
            if self.process.poll() is not None:
                time.sleep(0.1)  # let the reader take the last lines
                raise RuntimeError(
                    f"the service exited with {self.process.returncode}:\n{self.output}"
                )
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the service did not start within {timeout} s:\n{self.output}")

    def _read(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        if self._reader is not None:
            self._reader.join(5)
        return code

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rules_env(
    folder: Path, rules: str, storage: str | None = None, namespace: str | None = None
) -> dict[str, str]:
    """The ``RATELIMIT_*`` environment of a service deciding by ``rules`` (a rules file's
    text, written into ``folder``), on ``storage`` (default: memory) under ``namespace``."""
    path = folder / "rules.toml"
    path.write_text(rules)
    env = {"RATELIMIT_RULES_FILE": str(path)}
    if storage is not None:
        env["RATELIMIT_STORAGE"] = storage
    if namespace is not None:
        env["RATELIMIT_NAMESPACE"] = namespace
    return env


class EnvoyProcess(ServiceProcess):
    """``python -m ratelimit serve --envoy``, configured by envoyproxy/ratelimit's variables
    (``env``), every listener on a free port of 127.0.0.1: :attr:`port` is its gRPC port,
    :attr:`http_port` its ``/json`` and :attr:`debug_port` its ``/rlconfig``."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        super().__init__()
        self.env = {**os.environ, "USE_STATSD": "false", "LOG_LEVEL": "info"}
        for name in ("GRPC", "", "DEBUG"):
            self.env[f"{name}_HOST".lstrip("_")] = "127.0.0.1"
            self.env[f"{name}_PORT".lstrip("_")] = "0"
        self.env.update(env or {})
        self.http_port = 0
        self.debug_port = 0

    def start(self, timeout: float = 30.0) -> EnvoyProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ratelimit", "serve", "--envoy"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        pattern = r"API on [\d.]+:(\d+) \(gRPC\), [\d.]+:(\d+) \(HTTP.*, [\d.]+:(\d+) \(debug"
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    self.port, self.http_port, self.debug_port = map(int, found.groups())
                    return self
            if self.process.poll() is not None:
                time.sleep(0.1)  # let the reader take the last lines
                raise RuntimeError(
                    f"the service exited with {self.process.returncode}:\n{self.output}"
                )
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the service did not start within {timeout} s:\n{self.output}")

    def __enter__(self) -> EnvoyProcess:
        return self.start()
