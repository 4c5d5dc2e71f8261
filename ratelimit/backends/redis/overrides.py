"""Overrides on Redis (:class:`~ratelimit.backends.base.OverrideStore` for both engines):
one hash per namespace, ``rl:{<namespace>}:overrides``, from an override's identity to its
record, with the version in its empty field. A write reads the version and writes the
next one with the record stamped with it (:func:`~ratelimit.backends.base.stamped`: the
store orders overrides, never a writer's clock) in a ``WATCH``/``MULTI`` transaction,
tried again when another write came between; plain commands (no Lua), so they work
wherever the engines do, Redis Cluster included (one key: one slot). The writes of one
process on one namespace take turns (:func:`turn`), so that only other processes' writes
ever come between: concurrent ones of one process aborted each other's transactions until
their deadline passed (20 ``overrides.set`` at a time failed within the default 0.25 s).

Announced keys carry the server's time (``TIME``) and are pruned with expired overrides
once :data:`~ratelimit.backends.base.ANNOUNCED_FOR` old. Pruning expired overrides deletes
each only if it is still as it expired: the script
engine in one Lua script, the command engine (for servers that refuse Lua) in a
``WATCH``/``MULTI`` transaction that gives up, until the next prune, when another write
came between.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Sequence
from typing import Any

from ratelimit.backends.base import ANNOUNCED_FOR, announced_before, stamped
from ratelimit.backends.naming import PREFIX, encode_part
from ratelimit.backends.redis.compat import WatchError
from ratelimit.backends.redis.errors import replied
from ratelimit.errors import BackendError, LimiterClosedError

VERSION = ""
"""The hash field holding the version (no identity is empty)."""
ANNOUNCED = "key:"
WRITE_TRIES = 100
"""How many times a write is tried while other writes keep coming between (then it fails)."""

PRUNE_LUA = """
local now = tonumber(ARGV[1])
local horizon = tonumber(ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
local pruned = 0
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 1) == '[' then
    local ok, record = pcall(cjson.decode, all[i + 1])
    if ok and type(record) == 'table' and type(record.expires) == 'number'
        and record.expires <= now then
      redis.call('HDEL', KEYS[1], all[i])
      pruned = pruned + 1
    end
  elseif string.sub(all[i], 1, 4) == 'key:' then
    local at = tonumber(all[i + 1])
    if at == nil or at <= horizon then redis.call('HDEL', KEYS[1], all[i]) end
  end
end
if pruned > 0 then redis.call('HINCRBY', KEYS[1], '', 1) end
return pruned
"""


def overrides_key(namespace: str) -> str:
    """The hash of ``namespace``'s overrides (no ``:`` inside its hash tag, so it is no
    identifier's key)."""
    return f"{PREFIX}:{{{encode_part(namespace)}}}:overrides"


def turn(namespace: str) -> asyncio.Lock:
    """The lock the override writes (sets, deletes, announcements, prunes) of
    ``namespace`` take in the running event loop, whatever client or limiter makes them:
    held around a write's transaction, outside its deadline (a write waiting its turn is
    not late)."""
    loop = asyncio.get_running_loop()
    locks = _TURNS.get(loop)
    if locks is None:
        locks = _TURNS[loop] = {}
    lock = locks.get(namespace)
    if lock is None:
        lock = locks[namespace] = asyncio.Lock()
    return lock


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)
"""Per event loop (a lock serves one loop), per namespace, :func:`turn`'s lock."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisOverrides:
    """A mixin for the Redis engines: their host has ``client``, ``timeout`` and
    ``_closed``; ``prunes_with_scripts`` says how it prunes."""

    client: Any
    timeout: float | None
    _closed: bool
    prunes_with_scripts = True

    async def _close_idle(self) -> None:
        """Close the client's idle connections (one carried a reply that was not Redis's)."""
        raise NotImplementedError

    def _overrides_open(self) -> None:
        if self._closed:
            raise LimiterClosedError("this Redis backend")

    async def overrides_version(self, namespace: str) -> int:
        self._overrides_open()
        async with replied(self._close_idle, "reading the overrides' version", self.timeout):
            async with asyncio.timeout(self.timeout):
                version = await self.client.hget(overrides_key(namespace), VERSION)
            return 0 if version is None else int(version)

    async def overrides_load(self, namespace: str) -> tuple[int, dict[str, str]]:
        self._overrides_open()
        async with replied(self._close_idle, "reading the overrides", self.timeout):
            async with asyncio.timeout(self.timeout):
                stored = await self.client.hgetall(overrides_key(namespace))
            table = {_text(field): _text(value) for field, value in stored.items()}
            version = table.pop(VERSION, None)
            return (0 if version is None else int(version)), table

    async def overrides_write(
        self, namespace: str, identity: str, record: str | None, expires: float | None
    ) -> bool:
        self._overrides_open()
        key = overrides_key(namespace)
        async with turn(namespace), replied(self._close_idle, "writing an override", self.timeout):
            async with asyncio.timeout(self.timeout):
                for _ in range(WRITE_TRIES):
                    existed = await self._write_watching(key, identity, record)
                    if existed is not None:
                        return existed
        raise BackendError(
            f"redis: an override of namespace {namespace!r} not written: other writes came "
            f"between each of {WRITE_TRIES} tries"
        )

    async def _write_watching(self, key: str, identity: str, record: str | None) -> bool | None:
        """One try of a write; ``None`` when another write came between."""
        async with self.client.pipeline(transaction=True) as pipe:
            await pipe.watch(key)
            current = await pipe.hget(key, VERSION)
            existed = bool(await pipe.hexists(key, identity))
            version = (0 if current is None else int(current)) + 1
            pipe.multi()
            pipe.hset(key, VERSION, version)
            if record is None:
                pipe.hdel(key, identity)
            else:
                pipe.hset(key, identity, stamped(record, version))
            try:
                await pipe.execute()
            except WatchError:
                return None
        return existed

    async def overrides_announce(self, namespace: str, keys: Sequence[str]) -> None:
        self._overrides_open()
        if not keys:
            return
        async with (
            turn(namespace),
            replied(self._close_idle, "announcing limited keys", self.timeout),
        ):
            async with asyncio.timeout(self.timeout):
                at = repr(await self._server_seconds())
                await self.client.hset(
                    overrides_key(namespace), mapping={ANNOUNCED + key: at for key in keys}
                )

    async def _server_seconds(self) -> float:
        """The server's clock (``TIME``), in seconds: what dates announcements."""
        seconds, micros = await self.client.time()
        return int(seconds) + int(micros) / 1_000_000

    async def overrides_prune(self, namespace: str, now: float) -> int:
        self._overrides_open()
        key = overrides_key(namespace)
        async with (
            turn(namespace),
            replied(self._close_idle, "pruning expired overrides", self.timeout),
        ):
            async with asyncio.timeout(self.timeout):
                horizon = await self._server_seconds() - ANNOUNCED_FOR
                if self.prunes_with_scripts:
                    return int(await self.client.eval(PRUNE_LUA, 1, key, repr(now), repr(horizon)))
                return await self._prune_watching(key, now, horizon)

    async def _prune_watching(self, key: str, now: float, horizon: float) -> int:
        async with self.client.pipeline(transaction=True) as pipe:
            await pipe.watch(key)
            stored = await pipe.hgetall(key)
            expired = [
                field
                for field, record in stored.items()
                if _text(field).startswith("[") and _expired(_text(record), now)
            ]
            stale = [
                field
                for field, record in stored.items()
                if _text(field).startswith(ANNOUNCED) and announced_before(_text(record), horizon)
            ]
            if not expired and not stale:
                await pipe.unwatch()
                return 0
            pipe.multi()
            pipe.hdel(key, *expired, *stale)
            if expired:
                pipe.hincrby(key, VERSION, 1)
            try:
                await pipe.execute()
            except WatchError:  # written meanwhile: left for the next prune
                return 0
        return len(expired)


def _expired(record: str, now: float) -> bool:
    try:
        expires = json.loads(record).get("expires")
    except (ValueError, AttributeError):
        return False
    return isinstance(expires, int | float) and expires <= now
