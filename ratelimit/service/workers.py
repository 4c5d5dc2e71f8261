"""``ratelimit serve --workers N``: N processes answering on one port.

A supervisor checks that the port is free, then starts N workers (each ``ratelimit serve``
with its own event loop and storage connections, sharing the store's counters) that listen
on the port with ``SO_REUSEPORT``: the kernel spreads new connections over them. Where the
system has no ``SO_REUSEPORT`` (Windows), ``--workers`` above 1 is refused at start: run
one service per port behind a load balancer instead.

- SIGTERM or SIGINT: every worker stops gracefully (each answers every call it took, see
  :meth:`ratelimit.service.server.Service.shutdown`), then the supervisor exits 0.
- SIGHUP: every worker reloads the rules file (one still starting, once it listens).
- A worker that fails to start stops them all, and the supervisor exits with its code; one
  that dies later is started again (at most once a second).
- A supervisor killed by SIGKILL (which stops no worker): each worker sees it gone within a
  second and stops gracefully, rather than serve the port unsupervised.
- Prometheus metrics: each worker writes its metrics to files in a directory the supervisor
  made (``prometheus_client``'s multiprocess mode), and the supervisor serves their sums at
  ``/metrics``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig
from ratelimit.service.observing import WORKER
from ratelimit.service.tls import described

START_WITHIN = 60.0
"""How long a worker may take to start listening."""
RESTART_EVERY = 1.0
"""The least time between two starts of one worker."""
_SERVING = re.compile(r"^ratelimit: serving on ")


def free_port(host: str, port: int) -> int:
    """``port`` on ``host`` if nothing listens there (a free one for 0), checked by binding
    it without ``SO_REUSEPORT``; ``ConfigurationError`` when it is taken. With
    ``SO_REUSEADDR``, as gRPC binds: connections of a service stopped a moment ago, left in
    ``TIME_WAIT``, do not hold the port (a listener still does)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ConfigurationError(
            "--workers above 1 needs SO_REUSEPORT, which this system lacks: run one service "
            "per port behind a load balancer instead"
        )
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
            return int(probe.getsockname()[1])
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def stopped_code(codes: Sequence[int]) -> int:
    """The supervisor's exit code from its workers' once told to stop: 0 when each stopped
    (0, or ended by SIGTERM or SIGINT before it handled them), else the first other code, a
    worker ended by signal N as ``128 + N`` (as shells say it; a ``max`` of the codes would
    make a worker killed by SIGKILL, ``-9``, beside one that stopped, a clean stop)."""
    for code in codes:
        if code not in (0, -signal.SIGTERM, -signal.SIGINT):
            return code if code > 0 else 128 - code
    return 0


class Worker:
    """One worker process and the thread passing its standard output on."""

    def __init__(self, number: int, env: Mapping[str, str]) -> None:
        self.number = number
        self.ready = threading.Event()
        self.reload_asked = False
        """A SIGHUP came while it was starting: it is forwarded once the worker listens."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ratelimit", "serve"],
            env={**env, WORKER: str(number)},
            stdout=subprocess.PIPE,
            text=True,
        )
        self.started = time.monotonic()
        self._relay = threading.Thread(target=self._read, daemon=True)
        self._relay.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if _SERVING.match(line):
                self.ready.set()
            elif line.strip() != "ratelimit: stopped":
                print(f"worker {self.number}: {line}", end="", flush=True)

    def signal(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def reload(self) -> None:
        """SIGHUP, now if it listens (it handles SIGHUP from then on), else once it does:
        SIGHUP's default would end a worker still starting."""
        self.reload_asked = not self.ready.is_set()
        if not self.reload_asked:
            self.signal(signal.SIGHUP)

    def join(self) -> int:
        code = self.process.wait()
        self._relay.join(5)
        return code


class Supervisor:
    """The workers of one service, and what they are told."""

    def __init__(self, config: ServiceConfig, env: Mapping[str, str]) -> None:
        self.config = config
        self.port = free_port(config.host, config.port)
        self.env = {**env, "RATELIMIT_PORT": str(self.port), "RATELIMIT_WORKERS": "1"}
        self.folder: str | None = None
        self.metrics_port: int | None = None
        self._metrics_server: object | None = None
        self.workers: list[Worker] = []
        self._stopping = threading.Event()
        self._reload = threading.Event()

    def _serve_metrics(self) -> None:
        if self.config.metrics != "prometheus":
            return
        self.folder = tempfile.mkdtemp(prefix="ratelimit-metrics-")
        self.env["PROMETHEUS_MULTIPROC_DIR"] = self.folder
        from ratelimit.service.prometheus import MetricsServer, multiprocess_registry

        host, port = self.config.metrics_host or self.config.host, self.config.metrics_port
        try:
            server = MetricsServer(multiprocess_registry(self.folder), host, port)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{self.config.metrics_port} "
                f"(RATELIMIT_METRICS_PORT): {exc.strerror}"
            ) from None
        self._metrics_server, self.metrics_port = server, server.port

    def run(self) -> int:
        """Start the workers, print where they listen, and supervise them until a signal
        stops them; the exit code."""
        previous = {
            sig: signal.signal(sig, self._signalled)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            self._serve_metrics()
            self.workers = [Worker(n, self.env) for n in range(self.config.workers)]
            failed = self._started()
            if failed is not None:
                return failed
            self._announce()
            return self._supervise()
        finally:
            for worker in self.workers:
                worker.signal(signal.SIGTERM)
            for worker in self.workers:
                worker.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._clean()

    def _started(self) -> int | None:
        """Wait for every worker to listen; the exit code of one that could not."""
        deadline = time.monotonic() + START_WITHIN
        for worker in self.workers:
            while not worker.ready.wait(0.05):
                code = worker.process.poll()
                if code is not None or self._stopping.is_set():
                    return code or 0
                if time.monotonic() > deadline:
                    print(f"cannot start: worker {worker.number} did not start", file=sys.stderr)
                    return 3
        return None

    def _announce(self) -> None:
        config = self.config
        more = f", rules file {config.rules_file}" if config.rules_file else ""
        if self.metrics_port is not None:
            host = config.metrics_host or config.host
            more += f", metrics on http://{host}:{self.metrics_port}/metrics"
        more += described(config.tls_cert, config.tls_client_ca)
        print(
            f"ratelimit: serving on {config.host}:{self.port} ({config.workers} workers, "
            f"storage {config.storage}{more})",
            flush=True,
        )

    def _supervise(self) -> int:
        while not self._stopping.wait(0.1):
            if self._reload.is_set():
                self._reload.clear()
                for worker in self.workers:
                    worker.reload()
            for worker in self.workers:
                if worker.reload_asked and worker.ready.is_set():
                    worker.reload()
            for n, worker in enumerate(self.workers):
                code = worker.process.poll()
                if code is None or self._stopping.is_set():
                    continue
                worker.join()
                self._dead(worker)
                wait = RESTART_EVERY - (time.monotonic() - worker.started)
                if wait > 0 and self._stopping.wait(wait):
                    break
                print(f"ratelimit: worker {n} exited with {code}; starting it again", flush=True)
                self.workers[n] = Worker(n, self.env)
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        codes = [worker.join() for worker in self.workers]
        print("ratelimit: stopped", flush=True)
        return stopped_code(codes)

    def _signalled(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGHUP:
            self._reload.set()
        else:
            self._stopping.set()

    def _dead(self, worker: Worker) -> None:
        if self.folder is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(worker.process.pid, self.folder)  # type: ignore[no-untyped-call]

    def _clean(self) -> None:
        server = self._metrics_server
        if server is not None:
            server.close()  # type: ignore[attr-defined]
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def supervise(config: ServiceConfig, env: Mapping[str, str]) -> int:
    """Run ``config.workers`` workers of the service configured by ``env``; the exit code."""
    return Supervisor(config, env).run()
