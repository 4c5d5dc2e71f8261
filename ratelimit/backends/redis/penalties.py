"""Penalties on Redis (:class:`~ratelimit.backends.penalty_store.PenaltyStore` for both
engines). Per identifier held back, under the hash tag of its limit's key (its counters'
tag, unless they spread: then the penalty's keys stay under the key's; one slot)::

    rl:{<namespace>:<key>}[:<selector>=<value>]:pl   its recent refusals (a sorted set by
                                                     time, us), trimmed to the span
    rl:{<namespace>:<key>}[:<selector>=<value>]:ph   its hold: the end (us), PX the hold

and per namespace an index of the holds started, ``rl:{<namespace>}:penalties`` (a sorted
set of ``[key, selector, value]`` by the hold's end, us), written only when a hold starts
(which drops the holds ended) or is lifted, for listing.

On the script engine, noting a refusal is one Lua script (:data:`NOTE`, atomic, on the
server's ``TIME``) and reading a hold another (:data:`HOLD_LEFT`: ``PTTL``, ``GET`` under
an injected clock), both sent through the engine's automatic pipeline as decisions are. On
the command engine (no Lua), noting is ``TIME``, then the trim, add and count in one
pipeline, then ``SET NX`` (two processes that both count past the threshold start one
hold), and reading a plain ``PTTL`` (``GET``). Every key has a TTL.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from ratelimit.backends.base import clock_us
from ratelimit.backends.naming import PREFIX, encode_part, identifier_key
from ratelimit.backends.penalty_store import PenaltyHold
from ratelimit.backends.redis.compat import CLUSTERS
from ratelimit.backends.redis.errors import replied
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.core.plan import Identifier
from ratelimit.errors import LimiterClosedError

KEEP_INJECTED_MS = 86_400_000
"""Under an injected clock, how long keys stay past what the fake time needs (the server
expires keys on its own clock)."""

NOTE_LUA = """
-- KEYS[1] the refusal log, KEYS[2] the hold; ARGV: now (us, '' for TIME), span (us),
-- count, hold (ms), a unique member, how long keys stay past their use (ms).
-- Returns the hold's end (us) when this refusal started one, else 0.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local held = tonumber(redis.call('GET', KEYS[2]))
if held and held > now then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], now, ARGV[5])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) / 1000) + tonumber(ARGV[6]))
  return 0
end
redis.call('DEL', KEYS[1])
local ends = now + tonumber(ARGV[4]) * 1000
redis.call('SET', KEYS[2], ends, 'PX', tonumber(ARGV[4]) + tonumber(ARGV[6]))
return ends
"""


NOTE = Script(NOTE_LUA)
"""Noting a refusal on the script engine: through its automatic pipeline (``EVALSHA``)."""
HOLD_LEFT = Script("""
-- KEYS[1] a hold; ARGV[1] now (us; '' for the server's clock). Returns the us left, or 0.
local now = tonumber(ARGV[1])
if not now then
  local ms = redis.call('PTTL', KEYS[1])
  if ms > 0 then return ms * 1000 end
  return 0
end
local ends = tonumber(redis.call('GET', KEYS[1]))
if ends and ends > now then return ends - now end
return 0
""")
"""Reading a hold on the script engine: one script call, through the engine's automatic
pipeline as decisions go (batched with the calls in flight, on its fast path)."""
_SERVER_TIME = pack_args([b""])


def penalties_key(namespace: str) -> str:
    """The index of ``namespace``'s holds (no ``:`` inside its hash tag: no identifier's)."""
    return f"{PREFIX}:{{{encode_part(namespace)}}}:penalties"


def hold_key(target: Identifier) -> str:
    """The key of ``target``'s hold."""
    return f"{identifier_key(target)}:ph"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisPenalties:
    """A mixin for the Redis engines: their host has ``client``, ``clock``, ``timeout``,
    ``_closed``, ``_close_idle``, and on the script engine (Lua) ``_pipeline``, its
    automatic pipeline, which the penalties' scripts go through as decisions do."""

    client: Any
    clock: Any
    timeout: float | None
    _closed: bool

    async def _close_idle(self) -> None:
        raise NotImplementedError

    def _penalties_open(self) -> None:
        if self._closed:
            raise LimiterClosedError("this Redis backend")

    async def _penalty_now(self, key: str) -> int:
        """The time (us): the injected clock, else the server's that owns ``key``."""
        if self.clock is not None:
            return clock_us(self.clock)
        if isinstance(self.client, CLUSTERS):
            node = self.client.get_node_from_key(key)
            seconds, micros = await self.client.execute_command("TIME", target_nodes=node)
        else:
            seconds, micros = await self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    async def note_refusal(
        self, target: Identifier, count: int, span_ms: int, hold_ms: int
    ) -> float:
        self._penalties_open()
        name = identifier_key(target)
        log, hold = f"{name}:pl", f"{name}:ph"
        keep = 0 if self.clock is None else KEEP_INJECTED_MS
        member = secrets.token_hex(8)
        async with replied(self._close_idle, "noting a refusal for a penalty", self.timeout):
            async with asyncio.timeout(self.timeout):
                pipeline = getattr(self, "_pipeline", None)  # the script engine's
                if pipeline is not None:
                    now = b"" if self.clock is None else str(clock_us(self.clock)).encode()
                    args = [now, *(str(n).encode() for n in (span_ms * 1000, count, hold_ms))]
                    args += [member.encode(), str(keep).encode()]
                    command = Command(NOTE, [log, hold], args, pack_args(args))
                    ends = int(await pipeline.call(command, log))
                else:
                    ends = await self._note_commands(
                        log, hold, count, span_ms, hold_ms, member, keep
                    )
                if not ends:
                    return 0.0
                index = penalties_key(target.namespace)
                field = json.dumps([target.key, target.selector, target.value])
                pipe = self.client.pipeline(transaction=False)
                pipe.zadd(index, {field: ends})
                pipe.zremrangebyscore(index, "-inf", ends - hold_ms * 1000)  # ended by now
                pipe.pttl(index)
                if int((await pipe.execute())[-1]) < hold_ms + keep:  # never shortened
                    await self.client.pexpire(index, hold_ms + keep)
        return hold_ms / 1000

    async def _note_commands(
        self, log: str, hold: str, count: int, span_ms: int, hold_ms: int, member: str, keep: int
    ) -> int:
        now = await self._penalty_now(log)
        held = await self.client.get(hold)
        if held is not None and int(held) > now:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.zremrangebyscore(log, "-inf", now - span_ms * 1000)
        pipe.zadd(log, {member: now})
        pipe.zcard(log)
        pipe.pexpire(log, span_ms + keep)
        counted = (await pipe.execute())[2]
        if counted < count:
            return 0
        ends = now + hold_ms * 1000
        if not await self.client.set(hold, ends, px=hold_ms + keep, nx=True):
            held = await self.client.get(hold)
            if held is None or int(held) > now:
                return 0  # another process started it
            await self.client.set(hold, ends, px=hold_ms + keep)  # ended (an injected clock)
        await self.client.delete(log)
        return ends

    async def penalty_left(self, target: Identifier) -> float:
        self._penalties_open()
        hold = hold_key(target)
        pipeline = getattr(self, "_pipeline", None)  # the script engine's
        if pipeline is not None:
            if self.clock is None:
                args, packed = [b""], _SERVER_TIME
            else:
                args = [str(clock_us(self.clock)).encode()]
                packed = pack_args(args)
            left_us = int(await pipeline.call(Command(HOLD_LEFT, [hold], args, packed), hold))
            return left_us / 1_000_000 if left_us > 0 else 0.0
        async with replied(self._close_idle, "reading a penalty's hold", self.timeout):
            async with asyncio.timeout(self.timeout):
                if self.clock is None:
                    left_ms = int(await self.client.pttl(hold))
                    return left_ms / 1000 if left_ms > 0 else 0.0
                ends = await self.client.get(hold)
        left = 0 if ends is None else int(ends) - clock_us(self.clock)
        return left / 1_000_000 if left > 0 else 0.0

    async def _indexed(self, namespace: str) -> tuple[int, dict[str, int]]:
        index = penalties_key(namespace)
        now = await self._penalty_now(index)
        stored = await self.client.zrange(index, 0, -1, withscores=True)
        return now, {_text(field): int(end) for field, end in stored}

    async def list_penalties(self, namespace: str, key: str | None = None) -> list[PenaltyHold]:
        self._penalties_open()
        async with replied(self._close_idle, "listing penalties", self.timeout):
            async with asyncio.timeout(self.timeout):
                now, indexed = await self._indexed(namespace)
                ended = [field for field, end in indexed.items() if end <= now]
                if ended:
                    await self.client.zrem(penalties_key(namespace), *ended)
        holds = []
        for field, end in indexed.items():
            held_key, selector, value = json.loads(field)
            if end > now and (key is None or held_key == key):
                holds.append(PenaltyHold(held_key, selector, value, (end - now) / 1_000_000))
        return holds

    async def lift_penalties(
        self, namespace: str, key: str, selector: str | None = None, value: str | None = None
    ) -> int:
        self._penalties_open()
        async with replied(self._close_idle, "lifting penalties", self.timeout):
            async with asyncio.timeout(self.timeout):
                _now, indexed = await self._indexed(namespace)
                fields = {
                    field: end
                    for field, end in indexed.items()
                    if json.loads(field)[0] == key
                    and (selector is None or json.loads(field)[1:] == [selector, value])
                }
                targets = {Identifier(namespace, *json.loads(field)) for field in fields}
                if selector is not None:
                    targets.add(Identifier(namespace, key, selector, value))
                pipe = self.client.pipeline(transaction=False)  # one round trip, however many
                for target in targets:
                    name = identifier_key(target)
                    pipe.delete(f"{name}:ph")
                    pipe.delete(f"{name}:pl")
                if fields:
                    pipe.zrem(penalties_key(namespace), *fields)
                replies = await pipe.execute() if targets else []
        return sum(bool(deleted) for deleted in replies[0 : 2 * len(targets) : 2])
