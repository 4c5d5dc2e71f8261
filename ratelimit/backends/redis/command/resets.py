"""Resets on the command engine (``use_scripts=False``): a plan's keys deleted and each
identifier marked reset at now, in one ``MULTI``, as ``reset.lua`` does on the script
engine; a refund of a call reserved before the mark takes nothing (``settles.py`` reads
it)."""

from __future__ import annotations

from typing import Any

from ratelimit.backends.layout import reset_keep_ms
from ratelimit.backends.redis.command.decisions import Engine
from ratelimit.backends.redis.keys import reset_key
from ratelimit.core.plan import Plan


async def reset(engine: Engine, plan: Plan, keys: list[str]) -> None:
    """Delete ``keys`` (a plan's, for ``reset()``, in its layout) and mark each identifier
    reset at now: each mark kept as long as the longest of what it forgot (and an earlier
    mark) would have been."""
    spread = engine.spread and not plan.compiled.pinned
    marks = [reset_key(identifier, spread) for identifier in plan.identifiers]

    def fill(read: Any) -> None:
        for key in keys + marks:
            read.pttl(key)

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    keep_ms = max(reset_keep_ms(plan, injected=engine.clock is not None), *map(int, replies))
    write = engine._writes()
    for key in keys:
        write.delete(key)  # one by one: keys of one plan may lie in several slots
    for mark in marks:
        write.set(mark, now, px=keep_ms)
    await write.execute()
