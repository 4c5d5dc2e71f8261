"""Concurrency slots on the script engine (:mod:`ratelimit.core.slots`): acquiring, renewing,
releasing or revoking a claim is one ``slots.lua`` call, atomic, through the pipeline as
decisions go."""

from __future__ import annotations

from ratelimit.backends.base import clock_us
from ratelimit.backends.redis.errors import replied
from ratelimit.backends.redis.keys import prefix_of, revoked_key, slots_key
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.script.scripts import GENERAL, lua
from ratelimit.backends.redis.script.state import EngineState
from ratelimit.core.slots import SlotClaim

SLOTS_SCRIPT = Script(lua(*GENERAL, "slots.lua"))


class Slots(EngineState):
    """A mixin: the script engine's concurrency slots."""

    holds_slots = True
    """It holds concurrency slots (``slots.lua``)."""

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        done, held = await self._slots(claim, b"acquire")
        return done, held

    async def renew_slots(self, claim: SlotClaim) -> bool:
        return (await self._slots(claim, b"renew"))[0]

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        await self._slots(claim, b"revoke" if revoke else b"release")

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
