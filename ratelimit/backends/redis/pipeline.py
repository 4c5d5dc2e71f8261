"""Automatic pipelining: script calls made in the same event-loop turn go to Redis together.

Each call stays its own ``EVALSHA``, atomic on the server; a batch only shares the round
trip, in a pipeline without a transaction. Every call gets its own reply or its own error: a
script that fails, fails alone. ``NOSCRIPT`` (Redis restarted, or its scripts were flushed)
is answered once for the whole batch: the missing scripts are loaded and only the calls that
missed them are sent again, in one more round trip.

A call made while nothing is in flight goes out at once, from its caller's task: it never
waits for company. Calls made while others are in flight are queued and sent together at the
end of the loop turn, at most ``batch`` per pipeline and ``in_flight`` pipelines at a time.
When a batch comes back, its callers resume before the next one is sent, so the calls they
make next travel together too. Each batch has one deadline (``timeout``), not one per call.

:class:`ConnectionPipeline` drives a plain ``redis.asyncio.Redis`` directly: each batch
borrows a connection from the client's pool (so with its address, credentials, TLS and
connection limit) and gives it back when its replies are read (one may stay for the next
batch while the pool has plenty free). A batch is started only when
the pool has a connection free, or when none of this pipeline's own batches is in flight:
with a small or busy pool, calls wait for a batch of their own to come back and then travel
together (back-pressure, never an outage). It writes each batch as bytes packed once per
plan, and reads the replies back in order.
:class:`ClientPipeline` goes through the client's own ``pipeline()``, which routes each call
to its node on a ``RedisCluster``.

A batch is sent once. If the connection drops or the deadline passes after it was written,
its scripts may or may not have run: each caller gets a ``BackendError`` (its decision is
degraded), and a hit may stay counted on Redis, which only makes later calls be refused
sooner. redis-py's own retries apply to the ``ClientPipeline`` only.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ConnectionError,
    MaxConnectionsError,
    NoScriptError,
    ResponseError,
)

from ratelimit.backends.redis.connections import (
    closed_by_server,
    forget_other_loops,
    forget_other_loops_of,
    spare,
)
from ratelimit.backends.redis.errors import backend_error, is_backend_failure
from ratelimit.backends.redis.resp import Command
from ratelimit.errors import BackendError
from ratelimit.loops import LoopBinding

MAX_BATCH = 128
"""Most calls in one pipeline."""
MAX_IN_FLIGHT = 4
"""Most pipelines in flight at once, each on its own connection."""
KEEP_ONE_WHEN_SPARE = 8
"""A connection stays with the pipeline between batches only while the pool has more than
this many free for the application besides."""
MAX_ALONE = 1024
"""Without automatic pipelining: most calls in flight at once (each on its own connection,
as the pool has room)."""

Reply = Any


_Pending = tuple[Command, str, "asyncio.Future[Reply]"]


class Pipeline:
    """Batches concurrent calls; subclasses say how one batch travels (:meth:`_exchange`)
    and whether a connection is free for another batch (:meth:`_has_room`)."""

    def __init__(
        self,
        timeout: float | None,
        *,
        batch: int = MAX_BATCH,
        in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.timeout = timeout
        self._batch = batch
        self._max_in_flight = in_flight
        self._in_flight = 0
        self._pending: list[_Pending] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting = 0  # batches created but not yet run (they have no connection yet)
        self._loop = LoopBinding()

    async def call(self, command: Command, key: str) -> Reply:
        """The reply of ``command``; ``BackendError`` (naming ``key``) if it failed."""
        if self._loop.loop is not asyncio.get_running_loop():
            await self.bind()
        if self._pending or (
            self._in_flight
            and (self._batch > 1 or self._in_flight >= self._max_in_flight or not self._has_room())
        ):
            future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
            self._pending.append((command, key, future))
            self._schedule()
            return await future
        self._in_flight += 1  # alone: sent at once, from the caller's task
        try:
            reply = (await self._run([command]))[0]
        except Exception as exc:
            if not is_backend_failure(exc):
                raise
            raise self._error(key, exc) from exc
        finally:
            self._in_flight -= 1
            if self._pending:
                self._schedule()  # queued while this call was out
        if isinstance(reply, Exception):
            raise self._error(key, reply) from reply
        return reply

    async def bind(self) -> None:
        """Work in the running event loop. What an ended loop left in flight ended with it
        (its callers are gone too); what the pipeline holds of that loop is let go."""
        if self._loop.moved():
            self._in_flight = self._starting = 0
            self._pending = []
            self._scheduled = False
            self._tasks = set()
            await self._rebind()

    async def _rebind(self) -> None:
        """Let go of what belongs to another event loop (subclasses)."""

    def _has_room(self) -> bool:
        """Whether a connection is free for one more batch now."""
        return True

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending and self._in_flight < self._max_in_flight:
            if self._in_flight and not self._has_room():
                break  # a batch of ours will give its connection back: wait for it
            batch = self._pending[: self._batch]
            del self._pending[: self._batch]
            self._in_flight += 1
            self._starting += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        # Up to its first wait this runs at once: it takes its connection before any other
        # batch is started, so _has_room() counts it from here on.
        self._starting -= 1
        live = [p for p in batch if not p[2].done()]  # a cancelled caller's call is dropped
        try:
            replies = await self._run([c for c, _, _ in live]) if live else []
        except Exception as exc:  # the whole batch failed: each caller gets its own error
            replies = [exc] * len(live)
        except BaseException:
            for _, _, future in live:
                future.cancel()
            self._in_flight -= 1
            raise
        for (_, key, future), reply in zip(live, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(self._error(key, reply))
            else:
                future.set_result(reply)
        # Scheduled after the callers' wake-ups: what they ask next is queued while this
        # batch still counts as in flight, so it goes out together instead of one alone.
        asyncio.get_running_loop().call_soon(self._done)

    def _done(self) -> None:
        self._in_flight -= 1
        if self._pending:
            self._flush()

    async def _run(self, commands: list[Command]) -> list[Reply | Exception]:
        """Send one batch of decisions under this pipeline's deadline (``call`` bound the
        loop already)."""
        async with asyncio.timeout(self.timeout):
            return await self._exchange(commands)

    async def send(self, commands: list[Command], seconds: float | None) -> list[Reply | Exception]:
        """Send ``commands`` now as one batch within ``seconds``: per command its reply or its
        error (``NOSCRIPT`` handled). For bulk work off the request path, such as syncs.

        A batch is sent once: after a dropped connection or a missed deadline its scripts
        may or may not have run, and none is sent again."""
        if self._loop.loop is not asyncio.get_running_loop():
            await self.bind()
        async with asyncio.timeout(seconds):
            return await self._exchange(commands)

    def _error(self, key: str, exc: Exception) -> BackendError:
        """A fresh error for one call (a batch's callers never share one instance)."""
        return backend_error(exc, f"to decide key {key!r}", self.timeout)

    async def _exchange(self, commands: list[Command]) -> list[Reply | Exception]:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Let the batches in flight finish, then release what this pipeline holds."""
        if self._loop.loop is not None and self._loop.loop is not asyncio.get_running_loop():
            await self.bind()  # closing from another loop: the old one's work ended with it
        while self._tasks or self._pending:
            if self._pending and not self._scheduled:
                self._flush()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await asyncio.sleep(0)


class ConnectionPipeline(Pipeline):
    """Batches on connections borrowed from a plain ``redis.asyncio.Redis``'s pool: one per
    batch in flight, given back when the batch is done, never one the pool has no room for
    while a batch of its own can give one back.

    One connection may stay with the pipeline between batches, saving the pool's checkout
    on every call, but only while the pool keeps :data:`KEEP_ONE_WHEN_SPARE` connections
    free for the application besides; with a smaller or busier pool every connection goes
    back at once. ``aclose()`` gives it back too."""

    def __init__(
        self,
        client: aioredis.Redis,
        timeout: float | None,
        *,
        batch: int = MAX_BATCH,
        in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        super().__init__(timeout, batch=batch, in_flight=in_flight)
        self._pool = client.connection_pool
        self._held = 0  # connections batches in flight hold
        self._kept: Any = None  # the one connection kept between batches, if any
        self._given_back: list[asyncio.Future[None]] = []

    def _has_room(self) -> bool:
        return self._kept is not None or spare(self._pool) - self._starting > 0

    async def _rebind(self) -> None:
        self._held = 0
        self._kept = None  # the old loop's: forgotten with the others below
        self._given_back = []
        forget_other_loops(self._pool)

    async def _connection(self) -> Any:
        """A connection from the pool. When the pool has none left while this pipeline holds
        some (the application took the last one meanwhile), wait for one of its own."""
        if self._kept is not None:
            connection, self._kept = self._kept, None
            self._held += 1
            return connection
        while True:
            try:
                connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
            except MaxConnectionsError:
                if not self._held:
                    raise  # the application holds every connection: an outage for us too
                waiter = asyncio.get_running_loop().create_future()
                self._given_back.append(waiter)
                await waiter
                continue
            self._held += 1
            return connection

    async def _exchange(self, commands: list[Command]) -> list[Reply | Exception]:
        connection = await self._connection()
        try:
            if connection.is_connected and closed_by_server(connection):
                # Redis closed it (a restart) and the loop has read that: reconnect rather
                # than write a batch to a connection known dead (redis-py 8 no longer
                # checks when handing one out).
                await connection.disconnect(nowait=True)
            return await self._talk(connection, commands)
        except BaseException:
            await connection.disconnect(nowait=True)  # replies left unread would desync it
            raise
        finally:
            self._held -= 1
            await self._give_back(connection)

    async def _give_back(self, connection: Any) -> None:
        if (
            self._kept is None
            and not self._given_back
            and connection.is_connected
            and spare(self._pool) > KEEP_ONE_WHEN_SPARE
        ):
            self._kept = connection
            return
        await self._pool.release(connection)
        while self._given_back:  # a batch of ours waits for a connection: wake it
            waiter = self._given_back.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                break

    async def _talk(self, connection: Any, commands: list[Command]) -> list[Reply | Exception]:
        await self._write(connection, b"".join([c.packed for c in commands]))
        replies = [await self._read(connection) for _ in commands]
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if not missing:
            return replies
        scripts = {commands[i].script.sha: commands[i].script for i in missing}
        await self._write(
            connection,
            b"".join([s.load for s in scripts.values()] + [commands[i].packed for i in missing]),
        )
        for _ in scripts:
            loaded = await self._read(connection)
            if isinstance(loaded, Exception):
                raise loaded
        for i in missing:
            replies[i] = await self._read(connection)
        return replies

    async def _write(self, connection: Any, data: bytes) -> None:
        """Send ``data``. Under a deadline of our own, without redis-py's per-write timer
        (with ``socket_timeout`` set, its default, each write is a ``wait_for`` task)."""
        write = getattr(connection, "_send_packed_command", None)
        if self.timeout is None or write is None or not connection.is_connected:
            await connection.send_packed_command(data, check_health=False)
            return
        try:
            await write([data])
        except OSError as exc:
            await connection.disconnect(nowait=True)
            raise ConnectionError(f"error writing to redis: {exc}") from exc

    async def _read(self, connection: Any) -> Reply | Exception:
        """One reply, or the error Redis answered. Under a deadline of our own, without
        redis-py's per-read timer (``math.inf`` turns it off)."""
        try:
            return await connection.read_response(
                timeout=None if self.timeout is None else math.inf
            )
        except ResponseError as exc:
            return exc

    async def aclose(self) -> None:
        await super().aclose()
        if self._kept is not None:
            kept, self._kept = self._kept, None
            await self._pool.release(kept)


class ClientPipeline(Pipeline):
    """Batches through the client's ``pipeline(transaction=False)`` (``RedisCluster``)."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        timeout: float | None,
        *,
        batch: int = MAX_BATCH,
        in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        super().__init__(timeout, batch=batch, in_flight=in_flight)
        self._client = client

    async def _rebind(self) -> None:
        forget_other_loops_of(self._client)

    async def _exchange(self, commands: list[Command]) -> list[Reply | Exception]:
        replies = await self._pipelined(commands)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            for script in {commands[i].script.sha: commands[i].script for i in missing}.values():
                await self._client.script_load(script.source)  # on every node of a cluster
            again = await self._pipelined([commands[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipelined(self, commands: list[Command]) -> list[Reply | Exception]:
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command.arguments())
        replies: list[Reply | Exception] = await pipe.execute(raise_on_error=False)
        return replies


def pipeline_for(
    client: aioredis.Redis | RedisCluster, timeout: float | None, *, batch: int = MAX_BATCH
) -> Pipeline:
    """The pipeline for ``client``; ``batch=1`` sends every call on its own."""
    in_flight = MAX_IN_FLIGHT if batch > 1 else MAX_ALONE
    if isinstance(client, aioredis.Redis) and client.connection is None:
        return ConnectionPipeline(client, timeout, batch=batch, in_flight=in_flight)
    return ClientPipeline(client, timeout, batch=batch, in_flight=in_flight)
