"""Settles on the script engine (:mod:`ratelimit.core.settling`): one call of the settle
script of the plan's algorithm (``settle_log.lua``, ``settle_windows.lua``,
``settle_gcra.lua``: :func:`~ratelimit.backends.redis.script.scripts.settle_command`), queued
behind the batch in flight with the decisions when one is, else sent alone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.scripts import settle_command
from ratelimit.backends.redis.script.state import EngineState
from ratelimit.backends.redis.spanning import settled_by_parts, spanning
from ratelimit.core.settling import Settlement


class Settles(EngineState):
    """A mixin: the script engine's ``settle`` and ``settle_write``."""

    async def settle(self, settlement: Settlement) -> None:
        await self.settle_write(settlement)

    def settle_write(self, settlement: Settlement) -> Awaitable[Any]:
        """:meth:`settle`, as ``ratelimit.pipeline.settle_writes`` starts it: a settle queued
        behind the batch in flight is the pipeline's future of its reply, which stands whether
        or not anyone awaits it; otherwise a coroutine that sends it."""
        if self._closed or settlement.empty:
            return self._settle_alone(settlement, None)
        if self._spans and not settlement.plan.compiled.spreads:
            parts = spanning(settlement.plan)
            if parts is not None:
                return self._settle_parts(settled_by_parts(settlement, parts))
        command = settle_command(settlement, self.clock, self.spread)  # batched with decisions
        queued = self._pipeline.queued(command, settlement.plan.key)
        return self._settle_alone(settlement, command) if queued is None else queued

    async def _settle_parts(self, settlements: list[Settlement]) -> None:
        """A settle of a call decided by parts: one per part, at once."""
        await asyncio.gather(*(self._settle_alone(part, None) for part in settlements))

    async def _settle_alone(self, settlement: Settlement, command: Command | None) -> None:
        if self._closed:
            self._open()
        if settlement.empty:
            return
        if command is None:
            command = settle_command(settlement, self.clock, self.spread)
        pipeline, key = self._pipeline, settlement.plan.key
        future = pipeline.queued(command, key)
        await (pipeline.alone(command, key) if future is None else future)
