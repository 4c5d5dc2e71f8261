"""Resets on the script engine: one ``reset.lua`` call forgets what a plan's keys counted and
marks each identifier reset, which a settle's refund of a call reserved before reads."""

from __future__ import annotations

import asyncio

from ratelimit.backends.base import clock_us
from ratelimit.backends.layout import reset_keep_ms
from ratelimit.backends.redis.keys import plan_keys, reset_key
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.script.scripts import GENERAL, lua
from ratelimit.backends.redis.script.state import EngineState
from ratelimit.backends.redis.spanning import spanning
from ratelimit.core.plan import Plan

RESET_SCRIPT = Script(lua(*GENERAL, "reset.lua"))


class Resets(EngineState):
    """A mixin: the script engine's ``reset``."""

    async def reset(self, plan: Plan) -> None:
        self._open()
        if self._spans and not plan.compiled.spreads:
            parts = spanning(plan)
            if parts is not None:  # one reset per part: each in a slot of its own
                await asyncio.gather(*(self.reset(part.decide) for part in parts.every_part))
                return
        spread = self.spread and not plan.compiled.pinned
        keys = plan_keys(plan, spread)
        if not keys:
            return
        now = b"" if self.clock is None else str(clock_us(self.clock)).encode()
        keep_ms = reset_keep_ms(plan, injected=self.clock is not None)
        args = (now, str(len(keys)).encode(), str(keep_ms).encode())
        marks = [reset_key(identifier, spread) for identifier in plan.identifiers]
        await self._pipeline.call(
            Command(RESET_SCRIPT, keys + marks, args, pack_args(args)), plan.key
        )
