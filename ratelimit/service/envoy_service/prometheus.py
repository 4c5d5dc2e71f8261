"""The Go service's ``USE_PROMETHEUS`` sink: its stats, mapped by statsd_exporter's rules
(``default_mapper.yaml``, or ``PROMETHEUS_MAPPER_YAML``), served as ``promhttp.Handler()``
serves its registry: the text format 0.0.4 whatever the scraper asks for, gzipped for a
scraper that accepts it, on ``PROMETHEUS_ADDR`` and ``PROMETHEUS_PATH``. What the text says
is :mod:`.exposition`'s.

Not copied: the Go process's own series (``go_*``, ``process_*``, ``statsd_exporter_*``,
``promhttp_*``); a mapping's ``ttl``. A mapper file the Go service cannot load leaves it with
no mappings, silently; :meth:`StatsdMapper.from_file` raises
:class:`~ratelimit.service.envoy_config.yaml_go.ConfigFileError` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import time
from collections.abc import Callable, Mapping

from ratelimit.errors import ConfigurationError
from ratelimit.service.envoy_service.exposition import Exposition
from ratelimit.service.envoy_service.mapper import StatsdMapper
from ratelimit.service.envoy_service.stats import EnvoyStats

__all__ = ["TEXT_FORMAT", "PrometheusSink", "listen_address"]

TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
_HEAD_TIMEOUT = 10.0  # seconds a scraper has to send its request's head


class PrometheusSink:
    """Serves the stats as the Go service does with ``USE_PROMETHEUS=true``: counters and
    timers mapped by statsd_exporter's rules (``mapper``: the Go service's by default), in
    the text format 0.0.4 (:class:`~.exposition.Exposition`), on ``PROMETHEUS_ADDR`` and
    ``PROMETHEUS_PATH``; values are read at each scrape. ``clock`` (seconds, monotonic)
    moves a summary's window on.

    Example::

        sink = PrometheusSink(stats, StatsdMapper.from_file(path) if path else None)
        port = await sink.start(":9090", "/metrics")
        ...
        await sink.aclose()
    """

    def __init__(
        self,
        stats: EnvoyStats,
        mapper: StatsdMapper | None = None,
        extra_tags: Mapping[str, str] = {},
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stats = stats
        mapper = mapper if mapper is not None else StatsdMapper.default()
        self._exposition = Exposition(mapper, extra_tags, clock=clock)
        self._path = "/metrics"
        self._server: asyncio.Server | None = None

    def exposition(self) -> str:
        """The text a scrape gets (:meth:`.Exposition.text`)."""
        return self._exposition.text(self._stats)

    async def start(self, addr: str = ":9090", path: str = "/metrics") -> int:
        """Serve :meth:`exposition` at ``path`` on ``addr`` (Go's form: ``":9090"`` is every
        interface, ``"host:port"`` one; port 0 picks a free port); returns the port bound.
        A ``path`` ending in ``/`` serves every path below it, as Go's ``http.Handle``."""
        host, port = listen_address(addr)
        sock = await _listening_socket(host, port)
        self._path = path
        self._server = await asyncio.start_server(self._answer, sock=sock)
        return int(sock.getsockname()[1])

    async def aclose(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEAD_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(self._response(head.decode("latin-1")))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a scraper that went away, or sent no request in time
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _response(self, head: str) -> bytes:
        request_line, _, header_text = head.partition("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _http(400, "Bad Request", "text/plain; charset=utf-8", b"400 Bad Request")
        method, target, _ = parts
        path = target.partition("?")[0]
        if not (path == self._path or (self._path.endswith("/") and path.startswith(self._path))):
            return _http(404, "Not Found", "text/plain; charset=utf-8", b"404 page not found\n")
        headers = {}
        for line in header_text.split("\r\n"):
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        body = self.exposition().encode()
        encoding = None
        accepted = (part.strip() for part in headers.get("accept-encoding", "").split(","))
        if any(part == "gzip" or part.startswith("gzip;") for part in accepted):
            body, encoding = gzip.compress(body), "gzip"  # as promhttp does
        return _http(200, "OK", TEXT_FORMAT, body, encoding, with_body=method != "HEAD")


def listen_address(addr: str) -> tuple[str | None, int]:
    """Go's ``host:port`` (``net.SplitHostPort``): ``(None, 9090)`` for ``":9090"`` (every
    interface), ``("::1", 80)`` for ``"[::1]:80"``; :class:`ConfigurationError` else."""
    host, colon, port = addr.rpartition(":")
    if not colon:
        raise ConfigurationError(f"address {addr}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or "[" in host or "]" in host:
        raise ConfigurationError(f"address {addr}: too many colons in address")
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigurationError(f"address {addr}: invalid port {port!r}")
    return host or None, int(port)


async def _listening_socket(host: str | None, port: int) -> socket.socket:
    """One listening socket: dual-stack for every interface (one port for both families,
    also when it is picked), else the first address ``host`` resolves to."""
    if host is None:
        try:
            sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except (OSError, ValueError):  # no IPv6 here
            sock = socket.create_server(("", port))
    else:
        loop = asyncio.get_running_loop()
        addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = addresses[0]
        sock = socket.create_server(address, family=family)
    sock.setblocking(False)
    return sock


def _http(
    status: int,
    reason: str,
    content_type: str,
    body: bytes,
    encoding: str | None = None,
    *,
    with_body: bool = True,
) -> bytes:
    head = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        *([f"Content-Encoding: {encoding}"] if encoding else []),
        "Connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body if with_body else b"")
