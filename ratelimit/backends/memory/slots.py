"""Concurrency slots on the memory backend: per identifier, each holder's token and when its
lease ends; claims given back with ``revoke`` are refused until their lease would have
ended (``slots.lua`` does the same on Redis)."""

from __future__ import annotations

from typing import ClassVar

from ratelimit.backends.base import clock_us
from ratelimit.backends.memory.entries import Tables
from ratelimit.core.plan import Identifier
from ratelimit.core.slots import SlotClaim


class SlotTables(Tables):
    """A mixin: the memory backend's concurrency slots, in the dicts below, under its lock."""

    _slots: dict[Identifier, dict[str, int]]
    _revoked: dict[tuple[str, str, str], int]

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        self._check_open()
        with self._lock:
            now = clock_us(self._clock)
            held = []
            for identifier in claim.identifiers:
                holders = self._slots.get(identifier, {})
                for token in [t for t, ends in holders.items() if ends <= now]:
                    del holders[token]
                held.append(len(holders))
            if self._revoked.get((claim.namespace, claim.key, claim.token), 0) > now or any(
                n >= count for n, count in zip(held, claim.counts, strict=True)
            ):
                return False, tuple(held)
            for identifier in claim.identifiers:
                self._slots.setdefault(identifier, {})[claim.token] = now + claim.lease_us
            return True, tuple(held)

    async def renew_slots(self, claim: SlotClaim) -> bool:
        self._check_open()
        with self._lock:
            now = clock_us(self._clock)
            kept = True
            for identifier in claim.identifiers:
                holders = self._slots.get(identifier, {})
                if claim.token in holders:
                    holders[claim.token] = now + claim.lease_us
                else:
                    kept = False
            return kept

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        self._check_open()
        with self._lock:
            if revoke:
                until = clock_us(self._clock) + claim.lease_us
                self._revoked[(claim.namespace, claim.key, claim.token)] = until
            for identifier in claim.identifiers:
                holders = self._slots.get(identifier)
                if holders is not None:
                    holders.pop(claim.token, None)
                    if not holders:
                        del self._slots[identifier]

    holds_slots: ClassVar[bool] = True
    """It holds concurrency slots, in this process."""
