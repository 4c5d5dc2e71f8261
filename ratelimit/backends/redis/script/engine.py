"""The Redis backend's script engine: each decision one script call, atomic, on the server's clock.

:class:`RedisScriptBackend` holds the engine's client, pipeline and settings, and takes its
features from a module each: :mod:`.decisions` (one call of the plan's algorithm's script,
whose verdict stands), :mod:`.settles`, :mod:`.resets`, :mod:`.slots`, and the overrides and
penalties both Redis engines share (:mod:`ratelimit.backends.redis.overrides`,
:mod:`ratelimit.backends.redis.penalties`). Redis runs each script alone, so counting and
recording cannot interleave with another decision, and no lock is needed. Calls made in the
same event-loop turn go out together (:mod:`.pipeline`), each still atomic. Here too:
``sync_rate``'s syncs (``counter_sync.lua``, through the pipeline) and the counter API
(``counter_update.lua``, a script call of its own on the client). The time comes from Redis
``TIME`` (microseconds), so application servers need no clock agreement, unless a clock is
injected (tests).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Sequence

from redis.commands.core import AsyncScript

from ratelimit.backends.base import Clock, Push, Totals, clock_us
from ratelimit.backends.redis.client import (
    SCHEMES,
    RedisClient,
    close_client,
    redis_py_version,
    spreads_on,
)
from ratelimit.backends.redis.compat import CLUSTERS
from ratelimit.backends.redis.errors import (
    NOT_A_REPLY,
    backend_error,
    mapped,
    not_a_reply,
    replied,
)
from ratelimit.backends.redis.keys import counter_key
from ratelimit.backends.redis.old_layout import LayoutCheck
from ratelimit.backends.redis.overrides import RedisOverrides
from ratelimit.backends.redis.penalties import RedisPenalties
from ratelimit.backends.redis.resp import Command, Script, pack_args
from ratelimit.backends.redis.script import fast_pipeline
from ratelimit.backends.redis.script.decisions import Decisions
from ratelimit.backends.redis.script.pipeline import (
    MAX_ALONE,
    MAX_BATCH,
    MAX_IN_FLIGHT,
    ClientPipeline,
    Pipeline,
)
from ratelimit.backends.redis.script.replies import synced
from ratelimit.backends.redis.script.resets import Resets
from ratelimit.backends.redis.script.scripts import (
    BY_ALGORITHM,
    GENERAL,
    command_of,
    lua,
    spread_command_of,
)
from ratelimit.backends.redis.script.settles import Settles
from ratelimit.backends.redis.script.slots import Slots
from ratelimit.core.checks import check_clock, check_flag, check_timeout
from ratelimit.core.plan import CounterUpdate
from ratelimit.errors import ConfigurationError

COUNTER_UPDATE_LUA = lua(*GENERAL, "_windows.lua", "counter_update.lua")
COUNTER_SYNC_SCRIPT = Script(lua(*GENERAL, "_windows.lua", "counter_sync.lua"))
FAST_PATH_VARIABLE = "RATELIMIT_REDIS_FAST_PATH"
"""Set to ``0`` to keep the script engine on redis-py's public API (an escape hatch)."""
OFF = ("0", "false", "no", "off")
SYNC_TIMEOUT = 5.0
"""Deadline of one sync: it carries every live key's diffs at once, off the request path."""


class RedisScriptBackend(Decisions, Settles, Resets, Slots, RedisOverrides, RedisPenalties):
    """Decides plans with one Lua script call against ``client`` (:mod:`.decisions`).

    ``clock`` (seconds) replaces the server's ``TIME``, for tests that step time;
    ``owns_client`` closes the client in :meth:`aclose` (``RateLimit.from_url`` sets it).
    ``fast_path``: ``None`` (default) writes batches on borrowed connections where this
    redis-py version and client allow it (:mod:`~ratelimit.backends.redis.script.fast_pipeline`),
    ``False`` uses only redis-py's public ``pipeline()``; ``True`` insists on the fast path
    (``ConfigurationError`` where it cannot run). ``batch_scripts`` (default on) sends the
    decisions and settles of one pipelined batch as one call of the batch script
    (:mod:`~ratelimit.backends.redis.script.batch`), each decided as it would be alone.
    ``spread``: the setting of :class:`~ratelimit.Settings` (``None``: on a cluster client).

    Example::

        backend = RedisScriptBackend(redis.asyncio.Redis())
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        owns_client: bool = False,
        timeout: float | None = None,
        auto_pipeline: bool = True,
        fast_path: bool | None = None,
        batch_scripts: bool = True,
        spread: bool | None = None,
    ) -> None:
        check_timeout(timeout)  # the checks Settings makes of the same settings
        check_clock(clock)
        check_flag("auto_pipeline", auto_pipeline)
        check_flag("batch_scripts", batch_scripts)
        self.client = client
        self.clock = clock
        self.timeout = timeout
        self.spread = spreads_on(client, spread)
        """Whether identifiers with a selector get hash tags of their own
        (:mod:`~ratelimit.backends.redis.keys`), whatever tree counts on them (unless it
        was compiled pinned)."""
        self._spans = self.spread and isinstance(client, CLUSTERS)
        self._layout = LayoutCheck(client) if self.spread else None  # warns of old counters
        self._command_of = spread_command_of if self.spread else command_of
        # chosen once: a decision pays nothing for the layout (a plan whose tree does not
        # spread is pinned by either cache)
        self._owns_client = owns_client
        self._pipeline = pipeline_for(
            client,
            timeout,
            batch=MAX_BATCH if auto_pipeline else 1,
            fast_path=fast_path,
            join=batch_scripts,
        )
        self._update_script: AsyncScript = client.register_script(COUNTER_UPDATE_LUA)
        self._closed = False

    @property
    def fast_path(self) -> bool:
        """Whether batches go out on borrowed connections (the fast path), not through
        redis-py's public ``pipeline()``."""
        return isinstance(self._pipeline, fast_pipeline.ConnectionPipeline)

    @property
    def calls_per_script(self) -> Counter[int]:
        """How many script calls went to Redis carrying how many decisions or settles
        each (1: alone; more: one call of the batch script). For measuring."""
        return self._pipeline.calls_per_script

    algorithms = frozenset(BY_ALGORITHM)
    """The algorithms this backend decides: those with a script in
    :data:`~ratelimit.backends.redis.script.scripts.BY_ALGORITHM`."""
    schemes = SCHEMES
    """The storage URLs that open a client it drives (:data:`.client.SCHEMES`)."""

    async def update_counter(self, update: CounterUpdate) -> float:
        self._open()
        await self._pipeline.bind()
        args = (
            b"" if self.clock is None else clock_us(self.clock),
            update.size_us,
            repr(update.value),
            b"" if update.weight is None else repr(update.weight),
        )
        async with replied(
            self._close_idle, f"to update counter {update.identifier.key!r}", self.timeout
        ):
            async with asyncio.timeout(self.timeout):
                rate = await self._update_script(keys=[counter_key(update.identifier)], args=args)
            return float(rate)

    async def sync_counters(
        self, pushes: Sequence[Push]
    ) -> tuple[int | None, list[Totals | Exception]]:
        """For ``sync_rate``: push local diffs and fetch totals for many identifiers in one
        pipelined round trip. Returns Redis's time (us; ``None`` if no call succeeded) and,
        per push, its totals or the error of its call (its diffs were then not applied).
        ``LimiterClosedError`` once closed, as every call that would reach Redis. Each push
        is a call of its own on its identifier's one key, written where decisions of its
        tree keep it (spread when this engine and :attr:`Push.spreads
        <ratelimit.backends.base.Push.spreads>` both say so): one slot per call, which a
        cluster client's pipeline routes to its node."""
        self._open()
        now = b"" if self.clock is None else str(clock_us(self.clock)).encode()
        commands = []
        for identifier, entries, spreads in pushes:
            args = (now, " ".join(f"{s} {i} {d!r}" for s, i, d in entries).encode())
            keys = [counter_key(identifier, self.spread and spreads)]  # one slot per call
            commands.append(Command(COUNTER_SYNC_SCRIPT, keys, args, pack_args(args)))
        with mapped("to sync counters", SYNC_TIMEOUT):
            results = await self._pipeline.send(commands, SYNC_TIMEOUT) if commands else []
        server_now: int | None = None
        totals: list[Totals | Exception] = []
        for reply in results:
            if isinstance(reply, Exception):
                totals.append(backend_error(reply, "to sync a counter", SYNC_TIMEOUT))
                continue
            try:
                now_us, by_size = int(reply[0]), synced(reply)
            except NOT_A_REPLY as exc:
                await self._close_idle()
                totals.append(not_a_reply(exc, "to sync a counter"))
                continue
            server_now = now_us
            totals.append(by_size)
        return server_now, totals

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._layout is not None:
            await self._layout.aclose()  # before the client closes under a look
        await self._pipeline.aclose()
        if self._owns_client:
            await close_client(self.client)


def pipeline_for(
    client: RedisClient,
    timeout: float | None,
    *,
    batch: int = MAX_BATCH,
    fast_path: bool | None = None,
    join: bool = True,
) -> Pipeline:
    """The pipeline for ``client``; ``batch=1`` sends every call on its own. The environment
    variable ``RATELIMIT_REDIS_FAST_PATH=0`` makes ``fast_path=None`` mean ``False``."""
    in_flight = MAX_IN_FLIGHT if batch > 1 else MAX_ALONE
    if fast_path is None and os.environ.get(FAST_PATH_VARIABLE, "").lower() in OFF:
        fast_path = False
    fast = fast_pipeline.supported(client)
    if fast_path and not fast:
        low, high = (".".join(map(str, v)) for v in fast_pipeline.TESTED_REDIS_PY)
        raise ConfigurationError(
            "fast_path=True needs a plain redis.asyncio.Redis with redis-py's own pool, on "
            f"redis-py {low} up to (not with) {high}; this is a {type(client).__name__} on "
            f"redis-py {'.'.join(map(str, redis_py_version()))}"
        )
    if fast and fast_path is not False:
        return fast_pipeline.ConnectionPipeline(
            client,  # type: ignore[arg-type]
            timeout,
            batch=batch,
            in_flight=in_flight,
            join=join,
        )
    return ClientPipeline(client, timeout, batch=batch, in_flight=in_flight, join=join)
