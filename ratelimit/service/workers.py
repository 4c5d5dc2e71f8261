"""``ratelimit serve --workers N``: N processes answering on one port.

A supervisor checks that the port is free, then starts N workers (each ``ratelimit serve``
with its own event loop and storage connections, sharing the store's counters) that listen
on the port with ``SO_REUSEPORT``: the kernel spreads new connections over them. Where the
system has no ``SO_REUSEPORT`` (Windows), ``--workers`` above 1 is refused at start: run
one service per port behind a load balancer instead.

- SIGTERM or SIGINT: every worker stops gracefully (each answers every call it took, see
  :meth:`ratelimit.service.server.Service.shutdown`), then the supervisor exits 0.
- SIGHUP: every worker reloads the rules file (one still starting, once it listens).
- A worker that fails to start stops them all, and the supervisor exits with its code (3
  for a worker ended by a signal); one that dies later is started again, after a second,
  and after twice as long each time it dies again before it listens (at most
  :data:`RESTART_MOST`: a rules file made bad since does not make it spin).
- A worker that has not stopped :data:`STOP_WITHIN` seconds after SIGTERM (it answers every
  call it took within ``GRACE_SECONDS``) is killed: the supervisor never hangs.
- A supervisor killed by SIGKILL (which stops no worker): each worker sees it gone within a
  second and stops gracefully, rather than serve the port unsupervised.
- A worker started again decides with the rules the others hold (which may not be the
  rules file as written: a change seen without SIGHUP never removes a limit): each worker
  writes the rules it applied to a snapshot in a directory the supervisor made
  (:mod:`ratelimit.service.rules_snapshot`), which a worker that starts reads first.
- Prometheus metrics: each worker writes its metrics to files in a directory the supervisor
  made (``prometheus_client``'s multiprocess mode), and the supervisor serves their sums at
  ``/metrics``.
"""

from __future__ import annotations

import contextlib
import os
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
from typing import TYPE_CHECKING

from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig, address, bare_host
from ratelimit.service.observing import WORKER, serve_metrics, start_line
from ratelimit.service.rules_snapshot import SNAPSHOT
from ratelimit.service.server import GRACE_SECONDS

if TYPE_CHECKING:
    from ratelimit.service.prometheus import MetricsServer

FAILED = 3
"""The exit code of a service that could not start."""

START_WITHIN = 60.0
"""How long a worker may take to start listening."""
RESTART_EVERY = 1.0
"""The least time between two starts of one worker."""
RESTART_MOST = 30.0
"""The most time between two starts of a worker that keeps dying before it listens."""
STOP_WITHIN = GRACE_SECONDS + 5.0
"""How long workers told to stop have, before they are killed."""
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
        found = socket.getaddrinfo(bare_host(host), port, type=socket.SOCK_STREAM)
        family, kind, _, _, where = found[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
            return int(probe.getsockname()[1])
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {address(host, port)} (RATELIMIT_HOST, RATELIMIT_PORT): "
            f"{exc.strerror or exc}"
        ) from None


def stopped_code(codes: Sequence[int]) -> int:
    """The supervisor's exit code from its workers' once told to stop: 0 when each stopped
    (0, or ended by SIGTERM or SIGINT before it handled them), else the first other code, a
    worker ended by signal N as ``128 + N`` (as shells say it; a ``max`` of the codes would
    make a worker killed by SIGKILL, ``-9``, beside one that stopped, a clean stop)."""
    for code in codes:
        if code not in (0, -signal.SIGTERM, -signal.SIGINT):
            return code if code > 0 else 128 - code
    return 0


def ended(code: int) -> str:
    """How a worker ended, from its exit code."""
    if code < 0:
        return f"was ended by {signal.Signals(-code).name}"
    return f"exited with {code}"


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

    def join(self, by: float | None = None) -> int:
        """Its exit code once it ended; killed when still running at ``by`` (a
        ``time.monotonic()`` instant)."""
        try:
            code = self.process.wait(None if by is None else max(by - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            print(f"ratelimit: worker {self.number} did not stop: killed", flush=True)
            self.process.kill()
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
        self.rules_folder: str | None = None
        self.metrics_port: int | None = None
        self._metrics_server: MetricsServer | None = None
        self.workers: list[Worker] = []
        self._failures: dict[int, int] = {}
        """Per worker number: how many times in a row it died before it listened."""
        self._stopping = threading.Event()
        self._reload = threading.Event()

    def _serve_metrics(self) -> None:
        if self.config.metrics != "prometheus":
            return
        self.folder = tempfile.mkdtemp(prefix="ratelimit-metrics-")
        self.env["PROMETHEUS_MULTIPROC_DIR"] = self.folder
        from ratelimit.service.prometheus import multiprocess_registry

        server = serve_metrics(multiprocess_registry(self.folder), self.config)
        self._metrics_server, self.metrics_port = server, server.port

    def _share_rules(self) -> None:
        if self.config.rules_file:
            self.rules_folder = tempfile.mkdtemp(prefix="ratelimit-rules-")
            self.env[SNAPSHOT] = os.path.join(self.rules_folder, "rules.toml")

    def run(self) -> int:
        """Start the workers, print where they listen, and supervise them until a signal
        stops them; the exit code."""
        previous = {
            sig: signal.signal(sig, self._signalled)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            self._serve_metrics()
            self._share_rules()
            self.workers = [Worker(n, self.env) for n in range(self.config.workers)]
            failed = self._started()
            if failed is not None:
                return failed
            self._announce()
            return self._supervise()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._clean()

    def _started(self) -> int | None:
        """Wait for every worker to listen; the exit code of one that could not."""
        deadline = time.monotonic() + START_WITHIN
        for worker in self.workers:
            while not worker.ready.wait(0.05):
                code = worker.process.poll()
                if self._stopping.is_set():
                    return 0
                if code is not None:
                    print(
                        f"cannot start: worker {worker.number} {ended(code)} before it listened",
                        file=sys.stderr,
                    )
                    return code if code > 0 else FAILED
                if time.monotonic() > deadline:
                    print(f"cannot start: worker {worker.number} did not start", file=sys.stderr)
                    return FAILED
        return None

    def _announce(self) -> None:
        line = start_line(self.config, self.port, self.metrics_port, self.config.workers)
        print(line, flush=True)

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
                if worker.ready.is_set():
                    self._failures.pop(n, None)
                if code is None or self._stopping.is_set():
                    continue
                worker.join()
                self._dead(worker)
                failures = self._failures[n] = self._failures.get(n, 0) + (
                    not worker.ready.is_set()
                )
                pause = min(RESTART_EVERY * 2 ** max(failures - 1, 0), RESTART_MOST)
                print(
                    f"ratelimit: worker {n} {ended(code)}; starting it again in {pause:.0f} s",
                    flush=True,
                )
                wait = pause - (time.monotonic() - worker.started)
                if wait > 0 and self._stopping.wait(wait):
                    break
                self.workers[n] = Worker(n, self.env)
        codes = self._stop_all()
        print("ratelimit: stopped", flush=True)
        return stopped_code(codes)

    def _stop_all(self) -> list[int]:
        """SIGTERM every worker and wait for them, killing any still running after
        :data:`STOP_WITHIN`; their exit codes."""
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        by = time.monotonic() + STOP_WITHIN
        return [worker.join(by) for worker in self.workers]

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
        if self._metrics_server is not None:
            self._metrics_server.close()
        for folder in (self.folder, self.rules_folder):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def supervise(config: ServiceConfig, env: Mapping[str, str]) -> int:
    """Run ``config.workers`` workers of the service configured by ``env``; the exit code."""
    return Supervisor(config, env).run()
