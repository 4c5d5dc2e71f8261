"""envoyproxy/ratelimit's fixed windows on Redis, on its own keys, by its own commands.

Each window of a limit is one key (the service names it: prefix, domain, entries, window
start), counted as its service counts it: ``INCRBY`` of a descriptor's hits then ``EXPIRE``
of its unit, pipelined, no script (so that a Redis behind twemproxy, its default, takes them
key by key, each on its shard, and a fleet running both services counts every key where
both look for it); ``GET`` to only read. The requests of one moment share one pipeline (one
round trip, and one write on the connection); each request gets its own replies or its own
``BackendError``. On a plain ``redis.asyncio.Redis`` the automatic pipeline's fast path
carries them (:class:`PlainPipeline`: the commands packed once, written on a connection of
the client's pool; ``RATELIMIT_REDIS_FAST_PATH=0`` turns it off, as for the script engine);
elsewhere (a Redis Cluster, where each key goes to its node) redis-py's own pipeline, at most
:data:`MAX_REQUESTS` requests in one. Per-second limits go to a second Redis when one is
given (``REDIS_PERSECOND``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from ratelimit.backends.redis.client import close_client
from ratelimit.backends.redis.errors import backend_error, is_backend_failure, mapped
from ratelimit.backends.redis.resp import Command, pack
from ratelimit.backends.redis.script import fast_pipeline
from ratelimit.backends.redis.script.engine import FAST_PATH_VARIABLE, OFF
from ratelimit.backends.redis.script.pipeline import Reply

MAX_REQUESTS = 64
"""Most requests in one pipeline."""
Args = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Count:
    """One window's counter to add to: its key, the hits to add (0: only read it), its
    lifetime in seconds, and whether its limit is per second (``REDIS_PERSECOND``)."""

    key: str
    hits: int
    seconds: int
    per_second: bool = False


class _Plain:
    """One request's commands, packed: ``replies`` replies come back for them."""

    __slots__ = ("packed", "replies")

    def __init__(self, commands: Sequence[Args]) -> None:
        self.packed = b"".join(
            [pack(*(a if isinstance(a, bytes) else str(a).encode() for a in c)) for c in commands]
        )
        self.replies = len(commands)


class PlainPipeline(fast_pipeline.ConnectionPipeline):
    """The automatic pipeline's fast path for plain commands: each call is one request's
    commands (:class:`_Plain`), its reply the list of theirs (or the first error Redis
    answered to one of them)."""

    async def _talk(self, connection: Any, commands: list[Command]) -> list[Reply | Exception]:
        plain = cast(list[_Plain], commands)
        await self._write(connection, b"".join([c.packed for c in plain]))
        out: list[Reply | Exception] = []
        for c in plain:
            replies = [await self._read(connection) for _ in range(c.replies)]
            failed = next((r for r in replies if isinstance(r, Exception)), None)
            out.append(replies if failed is None else failed)
        return out

    async def run(self, commands: list[Args]) -> list[Any]:
        """The replies of ``commands`` (``BackendError`` if any failed)."""
        first = commands[0][1] if commands else ""
        reply: list[Any] = await self.call(cast(Command, _Plain(commands)), str(first))
        return reply


class _Batches:
    """One client's pipelines: the commands of the requests made in one turn of the loop
    go together."""

    def __init__(self, client: Any, timeout: float | None) -> None:
        self.client = client
        self.timeout = timeout
        self._pending: list[tuple[list[Args], asyncio.Future[list[Any]]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, commands: list[Args]) -> list[Any]:
        """The replies of ``commands`` (``BackendError`` if any failed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((commands, future))
        return await future

    def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:MAX_REQUESTS], self._pending[MAX_REQUESTS:]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[list[Args], asyncio.Future[list[Any]]]]) -> None:
        try:
            with mapped("counting envoyproxy/ratelimit's windows", self.timeout):
                async with asyncio.timeout(self.timeout):
                    pipe = self.client.pipeline(transaction=False)
                    for commands, _ in batch:
                        for args in commands:
                            pipe.execute_command(*args)
                    replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        at = 0
        for commands, future in batch:
            mine = replies[at : at + len(commands)]
            at += len(commands)
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if future.done():
                continue
            if failed is None:
                future.set_result(mine)
            elif is_backend_failure(failed):
                doing = "counting envoyproxy/ratelimit's windows"
                future.set_exception(backend_error(failed, doing, self.timeout))
            else:
                future.set_exception(failed)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)


class RedisWindows:
    """The windows on Redis (and a second Redis for per-second limits, if given);
    ``timeout``: each round trip's deadline. A failure raises ``BackendError``."""

    def __init__(self, client: Any, per_second: Any | None, timeout: float | None) -> None:
        self._clients = [client] if per_second is None else [client, per_second]
        fast = os.environ.get(FAST_PATH_VARIABLE, "").lower() not in OFF
        self._batches: list[PlainPipeline | _Batches] = [
            PlainPipeline(c, timeout, join=False)
            if fast and fast_pipeline.supported(c)
            else _Batches(c, timeout)
            for c in self._clients
        ]
        self._timeout = timeout

    async def add(self, counts: Sequence[Count]) -> list[int]:
        """``INCRBY`` then ``EXPIRE`` of each key; each key's count after."""

        def commands(count: Count) -> list[Args]:
            return [("INCRBY", count.key, count.hits), ("EXPIRE", count.key, count.seconds)]

        replies = await self._run(counts, commands)
        return [int(reply[0]) for reply in replies]

    async def read(self, counts: Sequence[Count]) -> list[int]:
        """``GET`` of each key; 0 for a key that does not exist."""
        replies = await self._run(counts, lambda count: [("GET", count.key)])
        return [int(reply[0] or 0) for reply in replies]

    async def _run(self, counts: Sequence[Count], commands: Any) -> list[list[Any]]:
        """Each count's replies to its ``commands``, the per-second ones on their Redis."""
        split = len(self._batches) == 2
        out: list[list[Any]] = [[] for _ in counts]
        sent = []
        for which, batches in enumerate(self._batches):
            mine = [i for i, c in enumerate(counts) if (split and c.per_second) == (which == 1)]
            if mine:
                listed = [commands(counts[i]) for i in mine]
                flat = [args for each in listed for args in each]
                sent.append((mine, listed, batches.run(flat)))
        results = await asyncio.gather(*(work for _, _, work in sent))
        for (mine, listed, _), replies in zip(sent, results, strict=True):
            at = 0
            for i, each in zip(mine, listed, strict=True):
                out[i] = replies[at : at + len(each)]
                at += len(each)
        return out

    async def ping(self) -> None:
        for client in self._clients:
            with mapped("answering PING", self._timeout):
                async with asyncio.timeout(self._timeout):
                    await client.ping()

    async def aclose(self) -> None:
        for batches in self._batches:
            await batches.aclose()
        for client in self._clients:
            await close_client(client)
