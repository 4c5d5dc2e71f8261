"""The automatic pipeline's fast path: batches written on connections borrowed from the pool.

:class:`ConnectionPipeline` does what :class:`~.pipeline.ClientPipeline`
does, without redis-py's pipeline object and its per-read and per-write timers: it takes a
connection from the client's pool, writes each batch as bytes packed once per plan
(``Command.packed``), and reads the replies back in order under the batch's one deadline. One
connection may stay with it between batches while the pool has plenty free.

It reads redis-py internals (the pool's ``_in_use_connections``, a connection's
``_send_packed_command`` and ``read_response(timeout=...)``), so it is used only on the
redis-py versions it was tested with (:data:`TESTED_REDIS_PY`), on a plain
``redis.asyncio.Redis`` with redis-py's own pool and connection classes; anything else gets
the public path. ``bench/suite.py`` measures both ("auto-pipelined" and "public API").
"""

from __future__ import annotations

import math
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

from ratelimit.backends.redis.client import redis_py_version
from ratelimit.backends.redis.connections import (
    close_idle,
    closed_by_server,
    forget_other_loops,
    spare,
)
from ratelimit.backends.redis.resp import Command, head_of
from ratelimit.backends.redis.script.pipeline import MAX_BATCH, MAX_IN_FLIGHT, Pipeline, Reply

KEEP_ONE_WHEN_SPARE = 8
"""A connection stays with the pipeline between batches only while the pool has more than
this many free for the application besides."""
TESTED_REDIS_PY = ((5, 3), (9, 0))
"""The redis-py versions this module was tested with: from the first, up to the second."""


def supported(client: object) -> bool:
    """Whether :class:`ConnectionPipeline` can drive ``client``."""
    low, high = TESTED_REDIS_PY
    if not low <= redis_py_version() < high:
        return False
    if not isinstance(client, aioredis.Redis) or client.connection is not None:
        return False  # a cluster, or a client of a single connection
    if getattr(client, "single_connection_client", False):
        return False  # it will hold one connection: keep to it
    pool = client.connection_pool
    return (
        isinstance(pool, aioredis.ConnectionPool)
        and hasattr(pool, "_in_use_connections")
        and issubclass(pool.connection_class, aioredis.connection.AbstractConnection)
        and hasattr(pool.connection_class, "_send_packed_command")
    )


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
        join: bool = True,
    ) -> None:
        super().__init__(timeout, batch=batch, in_flight=in_flight, join=join)
        self._client = client
        self._pool = client.connection_pool
        self._kept: Any = None  # the one connection kept between batches, if any

    def _has_room(self) -> bool:
        return self._kept is not None or spare(self._pool) - self._starting > 0

    async def _rebind(self) -> None:
        self._kept = None  # the old loop's: forgotten with the others below
        forget_other_loops(self._pool)

    async def close_idle(self) -> None:
        if self._kept is not None:
            await self._kept.disconnect(nowait=True)  # still ours: it reconnects when used
        await close_idle(self._client)

    async def _connection(self) -> Any:
        """A connection from the pool. When the pool has none left while this pipeline holds
        some (the application took the last one meanwhile), wait for one of its own."""
        if self._kept is not None:
            connection, self._kept = self._kept, None
        else:
            connection = await self._until_not_exhausted(self._pool.get_connection)
        self._holding += 1
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
            await self._give_back(connection)

    async def _give_back(self, connection: Any) -> None:
        if (
            self._kept is None
            and not self._given_back
            and connection.is_connected
            and spare(self._pool) > KEEP_ONE_WHEN_SPARE
        ):
            self._kept = connection
            self._holding -= 1  # kept for the next batch, which takes it without waiting
            return
        await self._pool.release(connection)
        self._connection_given_back()

    async def _talk(self, connection: Any, commands: list[Command]) -> list[Reply | Exception]:
        # Command.packed, inline: no call into resp.py per command (head_of: cached, in C)
        await self._write(
            connection,
            b"".join(
                [
                    head_of(c.script.sha, len(c.keys), len(c.args)) + c.packed_keys + c.packed_args
                    for c in commands
                ]
            ),
        )
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
