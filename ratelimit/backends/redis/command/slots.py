"""Concurrency slots on the command engine (``use_scripts=False``): ``slots.lua``'s take,
renew and give-back in plain commands, each run by the engine under its lock.

The same keys as the script, in the same layout (spread where the engine's ``spread`` and
the claim's :attr:`~ratelimit.core.slots.SlotClaim.spreads` say so): a sorted set per identifier
(holders' tokens scored by when their lease ends) and, for a claim given back with
``revoke``, a mark that a take of that token arriving later respects (it takes nothing)
until the lease has passed. The lock orders these steps; the script engine's atomic script
does the same on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from ratelimit.backends.redis.client import RedisClient
from ratelimit.backends.redis.keys import prefix_of, revoked_key, slots_key
from ratelimit.core.slots import SlotClaim


class Engine(Protocol):
    """What these steps use of the command engine
    (:class:`~ratelimit.backends.redis.command.engine.RedisCommandBackend`)."""

    client: RedisClient
    spread: bool
    """Whether identifiers with a selector get hash tags of their own."""

    async def _read(self, fill: Callable[[Any], None]) -> list[Any]: ...

    def _writes(self) -> Any: ...

    async def _now(self, replies: list[Any], key: str) -> int: ...


async def acquire(engine: Engine, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
    """Read every holder (and the claim's revocation mark), then write."""
    spread = engine.spread and claim.spreads
    keys = [slots_key(i, spread) for i in claim.identifiers]
    revoked = revoked_key(
        prefix_of(claim.namespace, claim.key, claim.identifiers, spread), claim.token
    )

    def fill(read: Any) -> None:
        for key in keys:
            read.zrange(key, 0, -1, withscores=True)
            read.pttl(key)
        read.exists(revoked)

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    held = [sum(1 for _, ends in replies[2 * k] if ends > now) for k in range(len(keys))]
    if replies[-1] or any(n >= count for n, count in zip(held, claim.counts, strict=True)):
        return False, tuple(held)
    ms = math.ceil(claim.lease_us / 1000)
    write = engine._writes()
    for k, key in enumerate(keys):
        write.zremrangebyscore(key, "-inf", now)
        write.zadd(key, {claim.token: now + claim.lease_us})
        if int(replies[2 * k + 1]) < ms:
            write.pexpire(key, ms)
    await write.execute()
    return True, tuple(held)


async def renew(engine: Engine, claim: SlotClaim) -> bool:
    keys = [slots_key(i, engine.spread and claim.spreads) for i in claim.identifiers]

    def fill(read: Any) -> None:
        for key in keys:
            read.zscore(key, claim.token)
            read.pttl(key)

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    ms = math.ceil(claim.lease_us / 1000)
    write = engine._writes()
    for k, key in enumerate(keys):
        if replies[2 * k] is not None:
            write.zadd(key, {claim.token: now + claim.lease_us})
            if int(replies[2 * k + 1]) < ms:
                write.pexpire(key, ms)
    await write.execute()
    return all(replies[2 * k] is not None for k in range(len(keys)))


async def release(engine: Engine, claim: SlotClaim, revoke: bool) -> None:
    spread = engine.spread and claim.spreads
    write = engine._writes()
    for identifier in claim.identifiers:
        write.zrem(slots_key(identifier, spread), claim.token)
    if revoke:
        ms = math.ceil(claim.lease_us / 1000)
        prefix = prefix_of(claim.namespace, claim.key, claim.identifiers, spread)
        write.set(revoked_key(prefix, claim.token), 1, px=ms)
    await write.execute()
