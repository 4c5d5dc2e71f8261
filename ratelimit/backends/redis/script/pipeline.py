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

:class:`ClientPipeline` sends each batch through redis-py's public API: the client's own
``pipeline(transaction=False)``, which takes a connection from the client's pool (with its
address, credentials, TLS and connection limit) or routes each call to its node on a
``RedisCluster``. When the pool has no connection left while a batch of this pipeline is out,
a batch waits for one of its own to come back (back-pressure, never an outage): taking a
connection fails before anything is written, so nothing is sent twice.
:mod:`~.fast_pipeline` does the same faster on the redis-py versions it
was tested with.

A batch is sent once. If the connection drops or the deadline passes after it was written,
its scripts may or may not have run: each caller gets a ``BackendError`` (its decision is
degraded), and a hit may stay counted on Redis, which only makes later calls be refused
sooner. redis-py's own retries (the client's ``retry=``) apply to this public path only.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ratelimit.backends.loops import LoopBinding
from ratelimit.backends.redis.compat import CLUSTERS, NoScriptError, ResponseError
from ratelimit.backends.redis.connections import (
    close_idle,
    drop_closed,
    forget_other_loops_of,
    pool_exhausted,
)
from ratelimit.backends.redis.errors import (
    backend_error,
    is_backend_failure,
    is_not_a_reply,
    not_a_reply,
)
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.batch import combine, split
from ratelimit.errors import BackendError

MAX_BATCH = 32
"""Most calls in one pipeline. Smaller than the callers a busy process has, so that several
batches are in flight: the callers of a returning batch make their next calls while Redis
runs another, and the client's work and the server's overlap instead of taking turns (what
larger batches measured: docs/stores.md, "Bounded")."""
MAX_IN_FLIGHT = 4
"""Most pipelines in flight at once, each on its own connection."""
MAX_ALONE = 1024
"""Without automatic pipelining: most calls in flight at once (each on its own connection,
as the pool has room)."""

Reply = Any
T = TypeVar("T")


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
        join: bool = True,
        by_slot: bool = False,
    ) -> None:
        self.timeout = timeout
        self.join = join
        """Whether the decisions and settles of a batch go as one call of the batch script
        (:mod:`~ratelimit.backends.redis.script.batch`), one per hash tag when ``by_slot``."""
        self._by_slot = by_slot
        self.calls_per_script: Counter[int] = Counter()
        """How many script calls went out carrying how many calls each: the batch-size
        distribution (a lone call counts as a script call carrying 1)."""
        self._batch = batch
        self._max_in_flight = in_flight
        self._in_flight = 0
        self._pending: list[_Pending] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting = 0  # batches created but not yet run (they have no connection yet)
        self._holding = 0  # batches of this pipeline holding a connection of the pool now
        self._given_back: list[asyncio.Future[None]] = []  # batches waiting for a connection
        self._loop = LoopBinding()

    def queued(self, command: Command, key: str) -> asyncio.Future[Reply] | None:
        """``command`` queued for the next batch, when it must wait for one (calls are in
        flight): the future of its reply (``BackendError`` naming ``key`` if it failed).
        ``None`` when it would go alone, or the pipeline is not bound to the running loop:
        then :meth:`call` sends it. The hot path awaits the future itself, saving a
        coroutine of its own per call."""
        loop = asyncio.get_running_loop()
        if self._loop.loop is not loop:
            return None
        if self._pending or (
            self._in_flight
            and (self._batch > 1 or self._in_flight >= self._max_in_flight or not self._has_room())
        ):
            future: asyncio.Future[Reply] = loop.create_future()
            self._pending.append((command, key, future))
            if not self._scheduled:
                self._scheduled = True
                loop.call_soon(self._flush)
            return future
        return None

    async def call(self, command: Command, key: str) -> Reply:
        """The reply of ``command``; ``BackendError`` (naming ``key``) if it failed."""
        if self._loop.loop is not asyncio.get_running_loop():
            await self.bind()
        future = self.queued(command, key)
        if future is not None:
            return await future
        return await self.alone(command, key)

    async def alone(self, command: Command, key: str) -> Reply:
        """:meth:`call` for a command :meth:`queued` did not queue: sent at once, from its
        caller's task (a batch that was sent meanwhile takes it along instead)."""
        if self._loop.loop is not asyncio.get_running_loop():
            await self.bind()
            future = self.queued(command, key)
            if future is not None:
                return await future
        self._in_flight += 1  # alone: sent at once, from the caller's task
        try:
            reply = (await self._run([command]))[0]
        except Exception as exc:
            reply = exc  # raised by the client, reading what answered, or by Redis
            if not is_backend_failure(exc) and not is_not_a_reply(exc):
                raise
        finally:
            self._in_flight -= 1
            if self._pending:
                self._schedule()  # queued while this call was out
        if isinstance(reply, Exception):
            if is_not_a_reply(reply):
                await self.close_idle()
            raise self._error(key, reply) from reply
        return reply

    async def bind(self) -> None:
        """Work in the running event loop. What an ended loop left in flight ended with it
        (its callers are gone too); what the pipeline holds of that loop is let go."""
        if self._loop.moved():
            self._in_flight = self._starting = self._holding = 0
            self._pending = []
            self._scheduled = False
            self._tasks = set()
            self._given_back = []
            await self._rebind()

    async def _rebind(self) -> None:
        """Let go of what belongs to another event loop (subclasses)."""

    async def close_idle(self) -> None:
        """Close the idle connections of the client (and any this pipeline keeps): one of
        them carried a reply that was not Redis's (subclasses)."""

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
        foreign = False  # a reply that was not Redis's
        for (_, key, future), reply in zip(live, replies, strict=True):
            if isinstance(reply, Exception):
                foreign = foreign or is_not_a_reply(reply)
                if not future.done():
                    future.set_exception(self._error(key, reply))
            elif not future.done():
                future.set_result(reply)
        # Scheduled after the callers' wake-ups: what they ask next is queued while this
        # batch still counts as in flight, so it goes out together instead of one alone.
        asyncio.get_running_loop().call_soon(self._done)
        if foreign:
            await self.close_idle()  # before the callers run: their next calls reconnect

    def _done(self) -> None:
        self._in_flight -= 1
        if self._pending:
            self._flush()

    async def _until_not_exhausted(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, which takes a connection from the pool first; when the pool has
        none left (nothing was written) while a batch of ours holds one, wait for that one
        to come back and try again: the application took the rest (back-pressure). When no
        batch of ours holds one, the application holds them all: that is an outage."""
        while True:
            try:
                return await attempt()
            except Exception as exc:
                if not pool_exhausted(exc) or not self._holding:
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._given_back.append(waiter)
            await waiter

    def _connection_given_back(self) -> None:
        """A batch of ours gave its connection back: wake one batch waiting for one."""
        self._holding -= 1
        while self._given_back:
            waiter = self._given_back.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _run(self, commands: list[Command]) -> list[Reply | Exception]:
        """Send one batch of decisions under this pipeline's deadline (``call`` bound the
        loop already): as one call of the batch script where it can (:attr:`join`)."""
        counted = self.calls_per_script
        async with asyncio.timeout(self.timeout):
            if self.join and len(commands) > 1:
                sent, layout = combine(commands, self._by_slot)
                if layout is not None:
                    for positions in layout:
                        counted[len(positions)] += 1
                    return split(await self._exchange(sent), layout)
            counted[1] += len(commands)
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
        if is_not_a_reply(exc):
            return not_a_reply(exc, f"to decide key {key!r}")
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


class ClientPipeline(Pipeline):
    """Batches through the client's ``pipeline(transaction=False)``: redis-py's public API,
    for a ``Redis`` (its pool) and a ``RedisCluster`` (routed per node) alike."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        timeout: float | None,
        *,
        batch: int = MAX_BATCH,
        in_flight: int = MAX_IN_FLIGHT,
        join: bool = True,
    ) -> None:
        super().__init__(
            timeout,
            batch=batch,
            in_flight=in_flight,
            join=join,
            by_slot=isinstance(client, CLUSTERS),
        )
        self._client = client

    async def _rebind(self) -> None:
        forget_other_loops_of(self._client)

    async def close_idle(self) -> None:
        await close_idle(self._client)

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
        return await self._until_not_exhausted(lambda: self._holding_one(commands))

    async def _holding_one(self, commands: list[Command]) -> list[Reply | Exception]:
        """:meth:`_execute`, counted as holding a connection unless the pool had none."""
        self._holding += 1
        try:
            replies = await self._execute(commands)
        except Exception as exc:
            if pool_exhausted(exc):
                self._holding -= 1  # it took none: nothing to give back
            else:
                self._connection_given_back()
            raise
        self._connection_given_back()
        return replies

    async def _execute(self, commands: list[Command]) -> list[Reply | Exception]:
        """One call as a plain command (lighter than a pipeline of one), or a pipeline."""
        await drop_closed(self._client)
        if len(commands) == 1:
            try:
                return [await self._client.execute_command(*commands[0].arguments())]
            except ResponseError as exc:  # an error Redis answered is this call's reply
                return [exc]
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command.arguments())
        replies: list[Reply | Exception] = await pipe.execute(raise_on_error=False)
        return replies
