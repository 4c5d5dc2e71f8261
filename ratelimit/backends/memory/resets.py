"""Resets on the memory backend: an identifier's entries forgotten, and a mark kept of when,
which a settle's refund of a call reserved before reads (``settles.py``)."""

from __future__ import annotations

from typing import Any

from ratelimit.backends.base import clock_us
from ratelimit.backends.layout import reset_keep_us
from ratelimit.backends.memory.entries import Tables
from ratelimit.core.plan import Identifier, Plan


class ResetTables(Tables):
    """A mixin: the memory backend's resets, on the dicts below, under its lock."""

    _stores: tuple[dict[Identifier, Any], ...]

    async def reset(self, plan: Plan) -> None:
        self._check_open()
        with self._lock:
            now = clock_us(self._clock)
            keep = now + reset_keep_us(plan)
            for identifier in plan.identifiers:
                # kept as long as what it forgot would have been, whatever rules wrote it
                # (a refund takes only from what is held), and as an earlier mark was
                until = max(keep, self._resets.get(identifier, (0, 0))[1])
                for store in self._stores:
                    entry = store.pop(identifier, None)
                    if entry is not None:
                        until = max(until, entry.expires_us)
                self._resets[identifier] = (now, until)
