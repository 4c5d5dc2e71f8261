"""envoyproxy/ratelimit's fixed windows on Redis, on its own keys.

Each window of a limit is one key (the service names it: prefix, domain, entries, window
start) counted by ``INCRBY`` of a descriptor's hits and ``EXPIRE`` of its unit, as its
service's pipeline sends them (``envoy_incrby.lua``): on one Redis every key of a request in
one script call (one round trip, batched with the other requests of the moment by the
automatic pipeline); on a Redis Cluster one call per key (a request's keys live in any
slot). Per-second limits go to a second Redis when one is given (``REDIS_PERSECOND``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ratelimit.backends.redis.client import close_client
from ratelimit.backends.redis.compat import CLUSTERS
from ratelimit.backends.redis.errors import mapped
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.script.engine import pipeline_for
from ratelimit.backends.redis.script.scripts import lua

INCREMENT = Script(lua("envoy_incrby.lua"))
READ = Script(lua("envoy_get.lua"))


@dataclass(frozen=True, slots=True)
class Count:
    """One window's counter to add to: its key, the hits to add (0: only read it), its
    lifetime in seconds, and whether its limit is per second (``REDIS_PERSECOND``)."""

    key: str
    hits: int
    seconds: int
    per_second: bool = False


class RedisWindows:
    """The windows on Redis (and a second Redis for per-second limits, if given);
    ``timeout``: each round trip's deadline. A failure raises ``BackendError``."""

    def __init__(self, client: Any, per_second: Any | None, timeout: float | None) -> None:
        self._clients = [client] if per_second is None else [client, per_second]
        self._pipelines = [pipeline_for(c, timeout, join=False) for c in self._clients]
        self._clusters = [isinstance(c, CLUSTERS) for c in self._clients]
        self._timeout = timeout

    async def add(self, counts: Sequence[Count]) -> list[int]:
        return await self._run(INCREMENT, counts, True)

    async def read(self, counts: Sequence[Count]) -> list[int]:
        return await self._run(READ, counts, False)

    async def _run(self, script: Script, counts: Sequence[Count], adding: bool) -> list[int]:
        out = [0] * len(counts)
        split = len(self._pipelines) == 2  # per-second limits on their own Redis
        for which, pipeline in enumerate(self._pipelines):
            mine = [i for i, c in enumerate(counts) if (split and c.per_second) == (which == 1)]
            if not mine:
                continue
            groups = [[i] for i in mine] if self._clusters[which] else [mine]
            for group in groups:
                keys = [counts[i].key for i in group]
                args: list[bytes] = []
                if adding:
                    for i in group:
                        args += [b"%d" % counts[i].hits, b"%d" % counts[i].seconds]
                command = Command(script, keys, args, pack_args(args))
                replies = await pipeline.call(command, keys[0])
                for i, reply in zip(group, replies, strict=True):
                    out[i] = int(reply)
        return out

    async def ping(self) -> None:
        for client in self._clients:
            with mapped("answering PING", self._timeout):
                async with asyncio.timeout(self._timeout):
                    await client.ping()

    async def aclose(self) -> None:
        for pipeline in self._pipelines:
            await pipeline.aclose()
        for client in self._clients:
            await close_client(client)
