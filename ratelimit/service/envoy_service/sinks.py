"""envoyproxy/ratelimit's stats, sent where its service sends them: statsd (``USE_STATSD``,
:class:`StatsdSink`, here) and Prometheus (``USE_PROMETHEUS``,
:class:`~.prometheus.PrometheusSink`, whose text is :mod:`.exposition`'s), under its names.

Both read :attr:`EnvoyStats.counters <ratelimit.service.envoy_service.stats.EnvoyStats>`
and :attr:`EnvoyStats.timers <ratelimit.service.envoy_service.stats.EnvoyStats>`. What the
statsd sink copies of the Go service, and where from:

- **Tags** (``EXTRA_TAGS``): gostats appends a scope's tags to each stat's name, sorted by
  key, as ``.__<key>=<value>`` (a value's ``.``, ``:`` and ``|`` made ``_``; a tag with an
  empty key or value left out). Every stat of the service is in its ``ratelimit`` or
  ``ratelimit_server`` scope, both given the tags, so every name gets them, for statsd and
  for Prometheus alike (:func:`~.stats.statsd_name`).
- **Counters**: gostats sends a counter's increase since its last flush as
  ``<name>:<increase>|c``, one per line, each line ending in ``\\n``; a counter that did
  not change is not sent.
- **Timers**: gostats sends each value of a timer as ``<name>:<value>|ms`` (a whole value
  from 0 as an integer, any other with six decimals, as its ``FlushTimer``); the service's
  values are whole milliseconds. Here each flush sends the values recorded since the last
  one, after the counters, grouped by value (statsd sums a flush interval: the order
  carries nothing). Bounded: a timer that got more than ``max_timer_lines`` values (10 000)
  since the last flush sends a uniform sample of them, marked with its sample rate
  (``<name>:<value>|ms|@0.1``: statsd and statsd_exporter count each sampled value
  ``1/rate`` times, so counts and rates stay right), where gostats would send every one;
  the first time is logged.
- **Transport**: the Go service sends them over TCP (``NewTCPStatsdSink``: one connection,
  dialled with a 1.5 s timeout, each write given 1 s, dialled again after a failure); over
  UDP (``protocol="udp"``, gostats' ``STATSD_PROTOCOL=udp``) lines are packed into
  datagrams of at most 1432 bytes (a line that is longer goes alone).

Not copied: gostats' queue of unsent statsd buffers (up to 4 MiB kept while statsd is down,
a failed write tried again once reconnected, dialling again every 3 s): here a flush whose
stats cannot be sent loses them, and statsd is tried again at the next flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from ratelimit.service.envoy_service.exposition import go_float
from ratelimit.service.envoy_service.mapper import StatsdMapper
from ratelimit.service.envoy_service.prometheus import (
    TEXT_FORMAT,
    PrometheusSink,
    listen_address,
)
from ratelimit.service.envoy_service.stats import EnvoyStats, statsd_name

__all__ = [
    "MAX_DATAGRAM",
    "MAX_TIMER_LINES",
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
MAX_TIMER_LINES = 10_000
"""The most values of one timer a flush sends (about 400 KB); more, and a sample goes."""
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

_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]


class StatsdSink:
    """Sends each counter's increase and each timer's values since the last flush to a
    statsd server, over TCP (as
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

    **Timers**: each value recorded since the last flush, one line each, after the
    counters; a timer that got more than ``max_timer_lines`` since (10 000) sends a uniform
    sample of that many at most, marked ``|@<rate>``, the first time logged (a warning).

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
        max_timer_lines: int = MAX_TIMER_LINES,
    ) -> None:
        if protocol not in _PROTOCOLS:
            raise ValueError(f"statsd protocol {protocol!r}: not one of {', '.join(_PROTOCOLS)}")
        if max_timer_lines < 1:
            raise ValueError(f"max_timer_lines={max_timer_lines}: at least 1")
        self._stats = stats
        self._host = host
        self._port = port
        self._tags = dict(extra_tags)
        self._protocol = protocol
        self._family = _PROTOCOLS[protocol]
        self._udp = protocol.startswith("udp")
        self._names: dict[str, str] = {}
        self._sent: dict[str, int] = {}  # each counter's value when last flushed
        self._timers_sent: dict[str, dict[int, int]] = {}  # each timer's counts then
        self._max_timer_lines = max_timer_lines
        self._sampling_logged = False
        self._random = random.Random()
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
        """Send the counters that changed and the timers' values since the last flush; never
        raises. Over TCP this may wait for a connection (1.5 s at most) and for statsd to
        take the write (1 s at most), then gives up on these stats; over UDP it does not
        wait."""
        lines = []
        for name, counter in list(self._stats.counters.items()):
            increase = counter.value - self._sent.get(name, 0)
            self._sent[name] = counter.value
            if increase > 0:
                lines.append(f"{self._statsd_name(name)}:{increase}|c\n".encode())
        for name, timer in list(self._stats.timers.items()):
            counts = dict(timer.counts)
            sent = self._timers_sent.get(name, {})
            self._timers_sent[name] = counts
            new = {v: n - sent.get(v, 0) for v, n in counts.items() if n > sent.get(v, 0)}
            lines.extend(self._timer_lines(name, new))
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

    def _timer_lines(self, name: str, values: dict[int, int]) -> list[bytes]:
        """The lines of a timer's ``values`` (``{milliseconds: times}``) since the last flush:
        each one, or a sample of them marked ``|@<rate>`` when there are more than
        ``max_timer_lines``."""
        prefix = f"{self._statsd_name(name)}:"
        got = sum(values.values())
        if got <= self._max_timer_lines:
            return [
                f"{prefix}{_timer_value(value)}|ms\n".encode()
                for value in sorted(values)
                for _ in range(values[value])
            ]
        every = math.ceil(got / self._max_timer_lines)  # one value sent for every `every`
        kept = round(got / every)
        rate = 1 / every
        if int(1 / rate) != every:  # statsd_exporter counts int(1 / rate) times
            rate = math.nextafter(rate, 0.0)
        sample = self._random.sample(list(values), counts=list(values.values()), k=kept)
        if not self._sampling_logged:
            self._sampling_logged = True
            logger.warning(
                "statsd %s:%s: %s got %d values since the last flush, more than %d: sending a "
                "uniform sample of %d, marked @%r (logged once)",
                self._host,
                self._port,
                name,
                got,
                self._max_timer_lines,
                kept,
                rate,
            )
        return [
            f"{prefix}{_timer_value(value)}|ms|@{rate!r}\n".encode() for value in sorted(sample)
        ]

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


def _timer_value(milliseconds: int) -> str:
    """A timer's value as gostats' ``FlushTimer`` writes it: a whole value from 0 (and below
    2**64) as an integer, any other as ``strconv.AppendFloat(v, 'f', 6, 64)``."""
    return str(milliseconds) if 0 <= milliseconds < 1 << 64 else f"{milliseconds:.6f}"


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
