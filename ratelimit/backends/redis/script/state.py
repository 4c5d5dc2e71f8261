"""What the script engine's feature mixins (:mod:`.decisions`, :mod:`.settles`,
:mod:`.resets`, :mod:`.slots`) share of the engine that holds them: its client and pipeline,
its clock, deadline and spread setting, and whether it is closed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit.backends.base import Clock
from ratelimit.backends.redis.client import RedisClient
from ratelimit.backends.redis.old_layout import LayoutCheck
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.pipeline import Pipeline
from ratelimit.backends.redis.script.scripts import plan_command
from ratelimit.core.plan import Plan
from ratelimit.core.settling import Settlement
from ratelimit.errors import LimiterClosedError


class EngineState:
    """The attributes :class:`~ratelimit.backends.redis.script.engine.RedisScriptBackend`
    sets, as its feature mixins read them."""

    client: RedisClient
    clock: Clock | None
    timeout: float | None
    spread: bool
    _spans: bool
    """Whether a call may span hash tags in slots of their own (``spread`` on a cluster
    client): then such a call is decided by parts (:mod:`.parts`)."""
    _pipeline: Pipeline
    _layout: LayoutCheck | None
    _command_of: Callable[[Plan], Command]
    _closed: bool
    settle: Callable[[Settlement], Awaitable[None]]

    def _open(self) -> None:
        if self._closed:
            raise LimiterClosedError("this Redis backend")

    async def _close_idle(self) -> None:
        await self._pipeline.close_idle()

    def _command(self, plan: Plan) -> Command:
        """The script call deciding ``plan`` (the old-layout check notes its layout): kept
        per plan on the server's clock, built per call on an injected one."""
        if self._layout is not None:
            self._layout.saw(plan)
        if self.clock is None:
            return self._command_of(plan)
        return plan_command(plan, self.clock, self.spread)

    def _sent(self, plan: Plan, command: Command | None = None) -> Awaitable[Any]:
        """The script call deciding ``plan`` (``command``, else the plan's own, whose
        layout the old-layout check notes), sent or queued: its reply, to await. Most calls
        get the pipeline's future (no coroutine of their own)."""
        if command is None:
            command = self._command(plan)
        pipeline = self._pipeline
        future = pipeline.queued(command, plan.key)
        return pipeline.alone(command, plan.key) if future is None else future
