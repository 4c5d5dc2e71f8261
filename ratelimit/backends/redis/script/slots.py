"""Concurrency slots on the script engine (:mod:`ratelimit.core.slots`): acquiring, renewing,
releasing or revoking a claim is one ``slots.lua`` call, atomic, through the pipeline as
decisions go; on a Redis Cluster, a claim whose identifiers lie in several slots makes one
call per slot (a take part by part, the parts taken given back when one is full)."""

from __future__ import annotations

import asyncio
import dataclasses

from ratelimit.backends.base import clock_us
from ratelimit.backends.redis.errors import replied
from ratelimit.backends.redis.keys import prefix_of, revoked_key, slots_key
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.script.scripts import GENERAL, lua
from ratelimit.backends.redis.script.state import EngineState
from ratelimit.core.plan import Identifier
from ratelimit.core.slots import SlotClaim

SLOTS_SCRIPT = Script(lua(*GENERAL, "slots.lua"))


class Slots(EngineState):
    """A mixin: the script engine's concurrency slots."""

    holds_slots = True
    """It holds concurrency slots (``slots.lua``)."""

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        parts = self._claim_parts(claim)
        if parts is None:
            return await self._slots(claim, b"acquire")
        return await self._acquire_parts(claim, parts)

    async def renew_slots(self, claim: SlotClaim) -> bool:
        parts = self._claim_parts(claim)
        if parts is None:
            return (await self._slots(claim, b"renew"))[0]
        renewed = await asyncio.gather(*(self._slots(part, b"renew") for part in parts))
        return all(done for done, _ in renewed)

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        op = b"revoke" if revoke else b"release"
        parts = self._claim_parts(claim)
        if parts is None:
            await self._slots(claim, op)
            return
        await asyncio.gather(*(self._slots(part, op) for part in parts))

    def _claim_parts(self, claim: SlotClaim) -> list[SlotClaim] | None:
        """``claim`` as one claim per hash tag its identifiers' slots lie under, the key's
        own last, when they lie in several slots of a Redis Cluster; else ``None``."""
        if not (self._spans and claim.spreads) or len(claim.identifiers) < 2:
            return None
        by_tag: dict[str, list[int]] = {}
        for k, identifier in enumerate(claim.identifiers):
            name = prefix_of(claim.namespace, claim.key, (identifier,), True)
            by_tag.setdefault(name, []).append(k)
        if len(by_tag) < 2:
            return None
        own = prefix_of(claim.namespace, claim.key, ())
        return [
            dataclasses.replace(
                claim,
                identifiers=tuple(claim.identifiers[k] for k in by_tag[name]),
                counts=tuple(claim.counts[k] for k in by_tag[name]),
            )
            for name in sorted(by_tag, key=lambda name: (name == own, name))
        ]

    async def _acquire_parts(
        self, claim: SlotClaim, parts: list[SlotClaim]
    ) -> tuple[bool, tuple[int, ...]]:
        """A slot on every part in turn; the first part without a free slot refuses the
        claim, and the parts taken before it are given back. Each identifier's count is
        read and taken atomically, so none holds more than its count."""
        held: dict[Identifier, int] = {}
        taken: list[SlotClaim] = []
        done = True
        for part in parts:
            done, counts = await self._slots(part, b"acquire")
            held.update(zip(part.identifiers, counts, strict=True))
            if not done:
                break
            taken.append(part)
        if not done:
            await asyncio.gather(*(self._slots(part, b"release") for part in taken))
        return done, tuple(held.get(identifier, 0) for identifier in claim.identifiers)

    async def _slots(self, claim: SlotClaim, op: bytes) -> tuple[bool, tuple[int, ...]]:
        """One ``slots.lua`` call."""
        if self._closed:
            self._open()
        now = b"" if self.clock is None else str(clock_us(self.clock)).encode()
        counts = " ".join(map(str, claim.counts)).encode()
        args = (now, op, claim.token.encode(), str(claim.lease_us).encode(), counts)
        spread = self.spread and claim.spreads
        keys = [slots_key(i, spread) for i in claim.identifiers]
        prefix = prefix_of(claim.namespace, claim.key, claim.identifiers, spread)
        keys.append(revoked_key(prefix, claim.token))
        reply = await self._pipeline.call(
            Command(SLOTS_SCRIPT, keys, args, pack_args(args)), claim.key
        )
        async with replied(self._close_idle, f"to hold slots of key {claim.key!r}", self.timeout):
            return bool(int(reply[0])), tuple(int(n) for n in reply[2:])
