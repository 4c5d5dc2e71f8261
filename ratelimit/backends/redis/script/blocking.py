"""Script calls of the sync API's direct path, sent by the calling threads themselves;
:func:`blocking_engine`, the script engine that sends them.

:class:`SyncPipeline` is what the script engine's ``decide`` awaits (``call``,
``close_idle``), answered by blocking calls of a synchronous redis-py connection in the
calling thread, so that its coroutine never suspends (:mod:`ratelimit.sync.direct`):

- A call made while fewer than ``in_flight`` calls are out (by default: none), and none is
  queued, goes out at once, from its own thread, on an idle connection of the pipeline's
  own (a new one from the client's pool when none is idle): a lone thread never waits for
  company, and never wakes another. The connections are as many as the calls out at once,
  never more than the pool's ``max_connections``.
- A call made while ``in_flight`` are out is queued. When a call or batch comes back, the
  thread that sent it hands the calls queued meanwhile (up to ``batch``) to the first of
  their threads, which sends them as one call of the batch script
  (:mod:`ratelimit.backends.redis.script.batch`, each decided as alone, under ``pcall``) and wakes
  the others with their replies.

Batching threads is not what the automatic pipeline's batching of tasks is: each queued
call costs a thread wake-up (a futex and the interpreter lock), about what the round trip's
own system calls cost the thread that goes alone, while the batch saves Redis only its
per-call share; but threads going alone contend for the interpreter lock after each reply,
and past a few threads that costs more. :data:`IN_FLIGHT` (64) lets threads go alone up to
64 calls out (or the pool's connections) and queues them past that, bounded by nothing but
``batch``, so that threads past the pool's connections wait instead of failing (the
measurements behind it: docs/threaded.md, ``bench/sync_api.py``).

Every system call gives the interpreter lock away, and at 32 threads each is a likely
thread switch; so a connection's deadline is kept by the kernel (:func:`_deadline_in_kernel`)
rather than by Python, which polls a socket with a timeout before each ``send`` and
``recv``.

``NOSCRIPT`` (Redis restarted, or its scripts flushed) loads the missing scripts and sends
again only the calls that missed them. A call is sent once: after a dropped connection or a
missed deadline (the socket's timeout, ``timeout``) its script may or may not have run, and
each of its callers gets the error, which the engine maps to ``BackendError`` (answered by the
failure policy). A connection that failed is closed. One the server closed while it sat idle
for :data:`RECHECK_IDLE` or more (a restart, an idle timeout) is opened again before it is
written to; asking the kernel costs a system call (and at 32 threads, a thread switch: a
quarter of a decision's CPU), so a connection back within that time is written to at once:
a server that closed it in between (``CLIENT KILL``; a restart by a person or a supervisor
takes longer, one scripted back to back may not) fails that one call, as a call under way
when it closed would, and the next call connects again. Such a call is not sent again on a
new connection: a kill that reached the server after the call did looks the same from
here (nothing answered), and a call sent again then would count twice.
"""

from __future__ import annotations

import collections
import copy
import math
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimit.backends.redis.compat import NoScriptError, ResponseError
from ratelimit.backends.redis.errors import (
    backend_error,
    is_backend_failure,
    is_not_a_reply,
    not_a_reply,
)
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.batch import combine, split
from ratelimit.backends.redis.script.engine import RedisScriptBackend
from ratelimit.backends.redis.script.pipeline import MAX_BATCH

RECHECK_IDLE = 0.01
"""Seconds a connection may sit idle and be written to again without first asking the
kernel whether the server closed it (see the module's docstring)."""
_clock = time.monotonic
"""What a connection's idle time is read from (tests make a restart take long)."""
IN_FLIGHT = 64
"""Most calls (or batches) out at once, each from its own thread on its own connection;
past it, calls queue and go out together (see the module's docstring)."""


class _Queued:
    """A call waiting for a batch: its command, its reply (or error), and the batch it
    sends itself when it is made the batch's sender (``lead``)."""

    __slots__ = ("command", "done", "lead", "reply")

    def __init__(self, command: Command) -> None:
        self.command = command
        self.reply: Any = None
        self.lead: list[_Queued] | None = None
        self.done = threading.Lock()
        self.done.acquire()


class SyncPipeline:
    """Script calls from the calling threads, batched past ``in_flight`` (see the module's
    docstring), on connections taken from ``client``'s pool."""

    def __init__(
        self,
        client: redis.Redis,
        timeout: float | None,
        *,
        batch: int = MAX_BATCH,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        self.client = client
        self.timeout = timeout
        self._batch = batch
        pool_limit = getattr(client.connection_pool, "max_connections", None) or in_flight
        self._max_in_flight = max(1, min(in_flight, pool_limit))
        self._in_flight = 0
        self._queue: collections.deque[_Queued] = collections.deque()
        self._lock = threading.Lock()
        self._idle: list[tuple[Any, float]] = []
        """Connections of ours no call is using, each with when its last call began
        (:data:`_clock`), taken and given back without a lock (a list's ``pop`` and
        ``append`` are atomic)."""

    async def call(self, command: Command, key: str) -> Any:
        """The reply of ``command``; ``BackendError`` (naming ``key``) if it failed."""
        try:
            reply = self._execute(command)
        except Exception as exc:
            reply = exc
        if isinstance(reply, Exception):
            if is_not_a_reply(reply):
                await self.close_idle()
                raise not_a_reply(reply, f"to decide key {key!r}") from reply
            if is_backend_failure(reply):
                raise backend_error(reply, f"to decide key {key!r}", self.timeout) from reply
            raise reply
        return reply

    def queued(self, command: Command, key: str) -> None:
        """Nothing is queued for the engine to await: every call goes out from its own
        thread (:meth:`alone`)."""
        return None

    async def alone(self, command: Command, key: str) -> Any:
        """:meth:`call`: what the engine awaits for a call :meth:`queued` did not queue."""
        return await self.call(command, key)

    async def close_idle(self) -> None:
        """Close the idle connections: one carried a reply that was not Redis's (the next
        calls connect again)."""
        for connection, _ in list(self._idle):
            connection.disconnect()

    def _execute(self, command: Command) -> Any:
        with self._lock:
            alone = self._in_flight < self._max_in_flight and not self._queue
            if alone:
                self._in_flight += 1
            else:
                queued = _Queued(command)
                self._queue.append(queued)
        if alone:
            try:
                return self._exchange([command])[0]
            finally:
                self._next()
        self._wait(queued)
        return queued.reply

    def _wait(self, queued: _Queued) -> None:
        """Wait for ``queued``'s reply; send its batch when it is made the sender."""
        try:
            queued.done.acquire()
        except BaseException:  # interrupted: leave the queue, or do what was handed over
            with self._lock:
                if queued in self._queue:
                    self._queue.remove(queued)
                    raise
            queued.done.acquire()  # taken into a batch already: its sender counts on us
            if queued.lead is not None:
                self._send(queued.lead)
            raise
        if queued.lead is not None:
            self._send(queued.lead)

    def _send(self, batch: list[_Queued]) -> None:
        """Send ``batch`` (its first call is this thread's) and answer every call of it."""
        interrupted = None
        try:
            replies = self._exchange([queued.command for queued in batch])
        except Exception as exc:  # the whole batch failed: each caller gets the error
            replies = [exc] * len(batch)
        except BaseException as exc:  # this thread was interrupted: the others go on
            interrupted = exc
            lost = redis.ConnectionError("the thread sending this batch was interrupted")
            replies = [lost] * len(batch)
        finally:
            self._next()
        for queued, reply in zip(batch, replies, strict=True):
            queued.reply = reply
            if queued is not batch[0]:
                queued.done.release()
        if interrupted is not None:
            raise interrupted

    def _next(self) -> None:
        """A batch came back: hand what was queued meanwhile to the first of its threads,
        or count one batch fewer out."""
        with self._lock:
            if not self._queue:
                self._in_flight -= 1
                return
            size = min(self._batch, len(self._queue))
            batch = [self._queue.popleft() for _ in range(size)]
        batch[0].lead = batch
        batch[0].done.release()

    def _exchange(self, commands: list[Command]) -> list[Any]:
        """Per command its reply or its error, on this thread's connection: several as one
        call of the batch script."""
        sent, layout = combine(commands, False) if len(commands) > 1 else (commands, None)
        replies = self._talk(sent)
        return replies if layout is None else split(replies, layout)

    def _talk(self, commands: list[Command]) -> list[Any]:
        idle = self._idle
        began = _clock()
        try:
            connection, since = idle.pop()
        except IndexError:  # as many connections as calls out at once
            connection, since = self.client.connection_pool.get_connection(), -math.inf
        try:
            if began - since >= RECHECK_IDLE and _closed_by_server(connection):
                connection.disconnect()  # Redis closed it (a restart): connect again
            if connection._sock is None:
                connection.connect()
            _deadline_in_kernel(connection._sock)
            connection.send_packed_command(
                [b"".join([c.packed for c in commands])], check_health=False
            )
            replies = [_read(connection) for _ in commands]
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if not missing:
                return replies
            scripts = {commands[i].script.sha: commands[i].script for i in missing}
            again = [s.load for s in scripts.values()] + [commands[i].packed for i in missing]
            connection.send_packed_command([b"".join(again)], check_health=False)
            for _ in scripts:
                loaded = _read(connection)
                if isinstance(loaded, Exception):
                    raise loaded
            for i in missing:
                replies[i] = _read(connection)
            return replies
        except redis.ConnectionError as exc:
            connection.disconnect()  # replies left unread would be read as another's
            if isinstance(exc.__context__, BlockingIOError):  # the kernel's deadline passed
                raise redis.TimeoutError("Timeout reading from socket") from exc
            raise
        except BaseException:
            connection.disconnect()
            raise
        finally:
            idle.append((connection, began))


def _read(connection: Any) -> Any:
    """One reply; an error Redis answered is returned, not raised."""
    try:
        return connection.read_response()
    except ResponseError as exc:
        return exc


def _deadline_in_kernel(sock: Any) -> None:
    """Give a plain socket with a timeout that timeout as the kernel's own (``SO_RCVTIMEO``,
    ``SO_SNDTIMEO``) and make it blocking, once per socket: Python polls a socket with a
    timeout before each ``send`` and ``recv``, two more system calls per decision, each
    giving the interpreter lock away (at 32 threads, a thread wake-up each). A missed
    deadline then raises ``BlockingIOError``, which :meth:`SyncPipeline._talk` turns into
    the ``TimeoutError`` Python's timeout gave. TLS sockets keep Python's timeout."""
    timeout = sock.gettimeout()
    if timeout is None or type(sock) is not socket.socket:
        return
    seconds = int(timeout)
    interval = struct.pack("ll", seconds, int((timeout - seconds) * 1e6) or 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, interval)
    sock.settimeout(None)


def _closed_by_server(connection: Any) -> bool:
    """Whether the server closed ``connection`` while it was idle (nothing is owed on it, so
    anything readable is its end)."""
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except ValueError:  # a descriptor select cannot watch, or a TLS socket: not known
        return False
    except OSError:
        return True


_CONNECTIONS: dict[type[Any], type[Any]] = {
    aioredis.Connection: redis.Connection,
    aioredis.UnixDomainSocketConnection: redis.UnixDomainSocketConnection,
    aioredis.SSLConnection: redis.SSLConnection,
}
"""The synchronous twin of each connection class of ``redis.asyncio`` the direct path
copies (any other: no direct path)."""


def sync_client(client: object, timeout: float | None) -> redis.Redis | None:
    """A synchronous client to the server ``client`` (a plain ``redis.asyncio.Redis``) talks
    to, with its connection options; ``None`` for any other client."""
    if type(client) is not aioredis.Redis:
        return None
    pool = client.connection_pool
    connection = _CONNECTIONS.get(pool.connection_class)
    if connection is None:
        return None
    options = dict(pool.connection_kwargs)
    options["retry"] = Retry(NoBackoff(), 0)  # sent once, as the engine's pipeline does
    if timeout is not None:
        options.setdefault("socket_timeout", timeout)
        options.setdefault("socket_connect_timeout", timeout)
    try:
        connection(**options)  # an option the synchronous class does not take: no path
    except (TypeError, ValueError):
        return None
    limit = getattr(pool, "max_connections", None)
    sync_pool = redis.ConnectionPool(connection_class=connection, max_connections=limit, **options)
    return redis.Redis(connection_pool=sync_pool)


def blocking_engine(
    engine: RedisScriptBackend,
) -> tuple[RedisScriptBackend, Callable[[], None]] | None:
    """A twin of ``engine`` whose calls go out from the calling thread on synchronous
    connections of the same server and options (its ``decide`` never suspends), and what
    closes those connections (its owner calls it); ``None`` where the client is not a plain
    ``redis.asyncio.Redis`` or its options have no synchronous twin."""
    client = sync_client(engine.client, engine.timeout)
    if client is None:
        return None
    twin = copy.copy(engine)
    twin._pipeline = SyncPipeline(client, engine.timeout)  # type: ignore[assignment]
    return twin, client.connection_pool.disconnect
