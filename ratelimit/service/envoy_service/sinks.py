"""envoyproxy/ratelimit's stats, sent where its service sends them: statsd (``USE_STATSD``)
and Prometheus (``USE_PROMETHEUS``), under its names.

Both read :attr:`EnvoyStats.counters <ratelimit.service.envoy_service.stats.EnvoyStats>`.
What they copy of the Go service, and where from:

- **Tags** (``EXTRA_TAGS``): gostats appends a scope's tags to each stat's name, sorted by
  key, as ``.__<key>=<value>`` (a value's ``.``, ``:`` and ``|`` made ``_``; a tag with an
  empty key or value left out). Every stat of the service is in its ``ratelimit`` scope, so
  every name gets them, for statsd and for Prometheus alike (:func:`statsd_name`).
- **statsd** (:class:`StatsdSink`): gostats sends a counter's increase since its last flush
  as ``<name>:<increase>|c``, one per line, each line ending in ``\\n``; a counter that did
  not change is not sent. The Go service sends them over TCP (``NewTCPStatsdSink``: one
  connection, dialled with a 1.5 s timeout, each write given 1 s, dialled again after a
  failure); over UDP (``protocol="udp"``, gostats' ``STATSD_PROTOCOL=udp``) lines are packed
  into datagrams of at most 1432 bytes (a line that is longer goes alone).
- **Prometheus** (:class:`PrometheusSink`): the service hands each flushed increase to
  statsd_exporter's mapper (``default_mapper.yaml``, or ``PROMETHEUS_MAPPER_YAML``) and
  serves its registry with ``promhttp.Handler()``: the text format 0.0.4 whatever the
  scraper asks for. statsd_exporter registers a counter under the mapped name exactly as
  the mapping writes it, so the series is ``ratelimit_service_rate_limit_total_hits{...}``,
  with no ``_total`` added (``prometheus_client`` would add one: it renders every counter
  family as ``<name>_total``, so this module renders the text itself). A name no rule maps
  is escaped (``escapeMetricName``; the mapping is :mod:`.mapper`); a counter still at zero is
  not shown, as the exporter makes a series on its first increase. Values are read when
  scraped, not when flushed.

Not copied: gostats' queue of unsent statsd buffers (up to 4 MiB kept while statsd is down,
a failed write tried again once reconnected, dialling again every 3 s): here a flush whose
stats cannot be sent loses them, and statsd is tried again at the next flush; the Go
process's own series (``go_*``, ``process_*``, ``statsd_exporter_*``, ``promhttp_*``); a
mapping's ``ttl``. A mapper file the Go service cannot load leaves it with no mappings,
silently; :meth:`StatsdMapper.from_file` raises
:class:`~ratelimit.service.envoy_config.yaml_go.ConfigFileError` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import math
import socket
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from ratelimit.errors import ConfigurationError
from ratelimit.service.envoy_service.mapper import Mapped, StatsdMapper
from ratelimit.service.envoy_service.stats import EnvoyStats

__all__ = [
    "MAX_DATAGRAM",
    "TEXT_FORMAT",
    "PrometheusSink",
    "StatsdMapper",
    "StatsdSink",
    "datagrams",
    "go_float",
    "listen_address",
    "statsd_name",
]

logger = logging.getLogger("ratelimit")

MAX_DATAGRAM = 1432
"""gostats' UDP buffer: the largest datagram that crosses a 1500-byte MTU unfragmented."""
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
_LOG_EVERY_LOST = 1 << 15  # gostats logs once per 32 KiB of dropped stats
_CONNECT_TIMEOUT = 1.5  # gostats' dial timeout, resolving included (net.DialTimeout)
_WRITE_TIMEOUT = 1.0  # gostats' write deadline: a statsd that does not read loses the stats
_PROTOCOLS = {  # STATSD_PROTOCOL's values, as Go's net.Dial reads them
    "tcp": socket.AF_UNSPEC,
    "tcp4": socket.AF_INET,
    "tcp6": socket.AF_INET6,
    "udp": socket.AF_UNSPEC,
    "udp4": socket.AF_INET,
    "udp6": socket.AF_INET6,
}
_HEAD_TIMEOUT = 10.0  # seconds a scraper has to send its request's head

_TAG_VALUE = str.maketrans(".:|", "___")
_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]


def statsd_name(name: str, tags: Mapping[str, str]) -> str:
    """``name`` with ``tags`` appended as gostats serializes them: ``.__<key>=<value>``
    sorted by key, a value's ``.``, ``:`` and ``|`` made ``_``, empty keys or values left
    out. ``statsd_name("a.b", {"env": "prod"}) == "a.b.__env=prod"``."""
    pairs = sorted(
        (key, value.translate(_TAG_VALUE)) for key, value in tags.items() if key and value
    )
    return name + "".join(f".__{key}={value}" for key, value in pairs)


# --- statsd ---------------------------------------------------------------------------------


class StatsdSink:
    """Sends each counter's increase since the last flush to a statsd server, over TCP (as
    envoyproxy/ratelimit does: gostats' ``NewTCPStatsdSink``) or UDP (``protocol="udp"``;
    ``"tcp4"``, ``"tcp6"``, ``"udp4"`` and ``"udp6"`` keep to one address family, as Go's
    ``net.Dial`` does). Nothing here raises, and counting never waits for statsd (only
    :meth:`flush`, in :meth:`run`'s task, does): a statsd that is down loses the stats, not
    the requests.

    **TCP**: one connection, opened at the first flush that has something to send and kept;
    each flush is one write of its lines. Connecting (resolving included) is given 1.5 s and
    a write 1 s to be taken (gostats' dial timeout and write deadline). A statsd that cannot
    be resolved, refuses, does not answer, or does not read in time loses that flush's
    stats, and is tried again at the next flush (with a new connection: a connection that
    failed or that statsd closed is not written to again). The first loss of an outage is
    logged (a warning), and its end (info), once each.

    **UDP**: the host is resolved once, here (again on each :meth:`run` tick until it
    resolves, if it did not). Lines are packed into datagrams of at most 1432 bytes, each
    sent at once or lost; the first loss is logged, then one in each 32 KiB lost.

    Example::

        sink = StatsdSink(stats, "localhost", 8125, extra_tags={"env": "prod"})
        task = asyncio.create_task(sink.run(every=10.0))  # STATS_FLUSH_INTERVAL
        ...
        task.cancel()  # run() flushes once more
        await sink.aclose()
    """

    def __init__(
        self,
        stats: EnvoyStats,
        host: str,
        port: int,
        extra_tags: Mapping[str, str] = {},
        *,
        protocol: str = "tcp",
    ) -> None:
        if protocol not in _PROTOCOLS:
            raise ValueError(f"statsd protocol {protocol!r}: not one of {', '.join(_PROTOCOLS)}")
        self._stats = stats
        self._host = host
        self._port = port
        self._tags = dict(extra_tags)
        self._protocol = protocol
        self._family = _PROTOCOLS[protocol]
        self._udp = protocol.startswith("udp")
        self._names: dict[str, str] = {}
        self._sent: dict[str, int] = {}  # each counter's value when last flushed
        self._closed = False
        # UDP
        self._socket: socket.socket | None = None
        self._lost = 0  # bytes of datagrams that could not be sent
        # TCP
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._sending = asyncio.Lock()  # one flush writes at a time, in the order they were made
        self._failing = False  # in an outage: its first loss was logged
        self._lost_in_outage = 0
        if self._udp:
            try:
                self._open(
                    socket.getaddrinfo(host, port, family=self._family, type=socket.SOCK_DGRAM)
                )
            except OSError as exc:
                logger.warning(
                    "statsd %s:%s: %s (stats are dropped until it resolves)", host, port, exc
                )

    async def flush(self) -> None:
        """Send the counters that changed since the last flush; never raises. Over TCP this
        may wait for a connection (1.5 s at most) and for statsd to take the write (1 s at
        most), then gives up on these stats; over UDP it does not wait."""
        lines = []
        for name, counter in list(self._stats.counters.items()):
            increase = counter.value - self._sent.get(name, 0)
            self._sent[name] = counter.value
            if increase > 0:
                lines.append(f"{self._statsd_name(name)}:{increase}|c\n".encode())
        if self._udp:
            self._send_datagrams(lines)
        elif lines and not self._closed:
            async with self._sending:
                await self._send_stream(b"".join(lines))

    async def run(self, every: float) -> None:
        """Flush every ``every`` seconds until cancelled, then once more."""
        try:
            while True:
                await asyncio.sleep(every)
                if self._udp and self._socket is None and not self._closed:
                    await self._resolve()
                await self.flush()
        finally:
            await self.flush()

    def close(self) -> None:
        """Close the socket or connection; a later :meth:`flush` sends nothing. What the TCP
        connection still holds goes out while the event loop runs (:meth:`aclose` waits)."""
        self._closed = True
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._disconnect()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the TCP connection has sent what it holds and is
        closed: 1 s at most, then it is dropped."""
        stream = self._stream
        self.close()
        if stream is None:
            return
        _, writer = stream
        try:
            async with asyncio.timeout(_WRITE_TIMEOUT):
                await writer.wait_closed()
        except TimeoutError:
            writer.transport.abort()
        except OSError:
            pass  # the connection had failed: nothing more to lose

    # TCP

    async def _send_stream(self, payload: bytes) -> None:
        writer = await self._connected()
        if writer is None:
            self._lost_in_outage += len(payload)
            return
        deadline = asyncio.timeout(_WRITE_TIMEOUT)
        try:
            writer.write(payload)
            async with deadline:
                await writer.drain()  # waits only when the transport holds more than 64 KiB
        except OSError as exc:
            if deadline.expired():
                reason = f"not read within {_WRITE_TIMEOUT:g} s"
                lost = writer.transport.get_write_buffer_size()
            else:
                reason, lost = _reason(exc), len(payload)
            self._disconnect(abort=True)
            self._failed(reason, lost)
            return
        if self._failing:
            logger.info(
                "statsd %s:%s: sending again (%d bytes of stats were dropped)",
                self._host,
                self._port,
                self._lost_in_outage,
            )
            self._failing = False
            self._lost_in_outage = 0

    async def _connected(self) -> asyncio.StreamWriter | None:
        """The connection, opened if there is none or the one there is can no longer be
        written to (it failed, or statsd closed it); ``None`` if it cannot be opened."""
        if self._stream is not None:
            reader, writer = self._stream
            if writer.is_closing() or reader.at_eof() or reader.exception() is not None:
                self._disconnect()
        if self._stream is None:
            deadline = asyncio.timeout(_CONNECT_TIMEOUT)
            try:
                async with deadline:
                    stream = await asyncio.open_connection(
                        self._host, self._port, family=self._family
                    )
            except (OSError, ValueError) as exc:  # ValueError: a name IDNA cannot encode
                if deadline.expired():
                    self._failed(f"connecting: no answer within {_CONNECT_TIMEOUT:g} s", 0)
                else:
                    self._failed(f"connecting: {_reason(exc)}", 0)
                return None
            if self._closed:  # closed while connecting
                stream[1].close()
                return None
            self._stream = stream
        return self._stream[1]

    def _disconnect(self, *, abort: bool = False) -> None:
        if self._stream is not None:
            _, writer = self._stream
            self._stream = None
            if abort:
                writer.transport.abort()  # what it still holds is lost
            else:
                writer.close()

    def _failed(self, reason: str, lost: int) -> None:
        self._lost_in_outage += lost
        if not self._failing:
            self._failing = True
            logger.warning(
                "statsd %s:%s (%s): %s (stats are dropped until it is back; tried at each flush)",
                self._host,
                self._port,
                self._protocol,
                reason,
            )

    # UDP

    def _send_datagrams(self, lines: list[bytes]) -> None:
        if self._socket is None:
            return
        for datagram in datagrams(lines):
            try:
                self._socket.send(datagram)
            except OSError as exc:  # refused (an earlier datagram's ICMP), buffer full, ...
                self._dropped(len(datagram), exc)

    def _dropped(self, size: int, exc: OSError) -> None:
        before, self._lost = self._lost, self._lost + size
        if before == 0 or before // _LOG_EVERY_LOST != self._lost // _LOG_EVERY_LOST:
            logger.warning(
                "statsd %s:%s: %s (%d bytes of stats dropped so far)",
                self._host,
                self._port,
                exc,
                self._lost,
            )

    def _statsd_name(self, name: str) -> str:
        found = self._names.get(name)
        if found is None:
            found = self._names[name] = statsd_name(name, self._tags)
        return found

    async def _resolve(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            self._open(
                await loop.getaddrinfo(
                    self._host, self._port, family=self._family, type=socket.SOCK_DGRAM
                )
            )

    def _open(self, addresses: Sequence[_AddrInfo]) -> None:
        family, kind, protocol, _, address = addresses[0]
        sock = socket.socket(family, kind, protocol)
        try:
            sock.setblocking(False)  # a full send buffer drops the datagram, never waits
            sock.connect(address)  # so that an unreachable port is reported on later sends
        except OSError:
            sock.close()
            raise
        self._socket = sock


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def datagrams(lines: list[bytes]) -> list[bytes]:
    """``lines`` packed in order into datagrams of at most :data:`MAX_DATAGRAM` bytes."""
    packed: list[bytes] = []
    current = bytearray()
    for line in lines:
        if current and len(current) + len(line) > MAX_DATAGRAM:
            packed.append(bytes(current))
            current.clear()
        current += line
    if current:
        packed.append(bytes(current))
    return packed


# --- Prometheus -----------------------------------------------------------------------------


class PrometheusSink:
    """Serves the counters as the Go service does with ``USE_PROMETHEUS=true``: mapped by
    statsd_exporter's rules (``mapper``: the Go service's by default), in the text format
    0.0.4, on ``PROMETHEUS_ADDR`` and ``PROMETHEUS_PATH``; values are read at each scrape.
    Counters that map to the same name and labels are summed, as the exporter adds their
    increases to one series.

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
    ) -> None:
        self._stats = stats
        self._mapper = mapper if mapper is not None else StatsdMapper.default()
        self._tags = dict(extra_tags)
        self._mapped: dict[str, Mapped | None] = {}
        self._path = "/metrics"
        self._server: asyncio.Server | None = None

    def exposition(self) -> str:
        """The text a scrape gets: families sorted by name, each ``# HELP``, ``# TYPE
        <name> counter`` and its series sorted by label values, values as Go writes them."""
        families: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}
        for name, counter in list(self._stats.counters.items()):
            if counter.value == 0:
                continue  # gostats flushes no zero increase: the series does not exist yet
            if name in self._mapped:
                mapped = self._mapped[name]
            else:
                mapped = self._mapped[name] = self._mapper.map(statsd_name(name, self._tags))
            if mapped is None:
                continue
            value = float(counter.value) * (1.0 if mapped.scale is None else mapped.scale)
            if value < 0:
                continue  # the exporter refuses a negative increase
            _, series = families.setdefault(mapped.name, (mapped.help, {}))
            series[mapped.labels] = series.get(mapped.labels, 0.0) + value
        lines = []
        for family in sorted(families):
            help_text, series = families[family]
            lines.append(f"# HELP {family} {_escaped(help_text, quotes=False)}\n")
            lines.append(f"# TYPE {family} counter\n")
            for labels in sorted(series, key=lambda ls: (len(ls), [value for _, value in ls])):
                pairs = ",".join(f'{key}="{_escaped(value, quotes=True)}"' for key, value in labels)
                lines.append(f"{family}{{{pairs}}}" if pairs else family)
                lines.append(f" {go_float(series[labels])}\n")
        return "".join(lines)

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


def _escaped(text: str, *, quotes: bool) -> str:
    """The text format's escaping: ``\\`` and newline, and ``"`` in a label value."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quotes else text


def go_float(value: float) -> str:
    """A value as Go's text format writes it (``strconv.FormatFloat(v, 'g', -1, 64)``):
    ``5``, ``0.25``, ``1.234567e+06`` (exponent form from 1e6 up and below 1e-4)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    point = len(digit_tuple) + exponent  # the decimal point's place after the first digit
    scale = point - 1
    minus = "-" if value < 0 else ""
    if scale < -4 or scale >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{minus}{mantissa}e{'-' if scale < 0 else '+'}{abs(scale):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return minus + digits + "0" * (point - len(digits))
    return f"{minus}{digits[:point]}.{digits[point:]}"
