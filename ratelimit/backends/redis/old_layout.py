"""The one-time warning of counters kept in the layout before spreading.

An engine whose ``spread`` is on keeps each identifier with a selector under a hash
tag of its own (``rl:{<ns>:<key>:<selector>=<value>}``, :mod:`.keys`), where earlier
versions, and ``spread=False``, keep every identifier of a (namespace, key) under one
(``rl:{<ns>:<key>}:<selector>=<value>``). A limiter upgraded in place on a Redis Cluster
no longer reads what the old layout counted: each identifier starts again from nothing,
once. :class:`LayoutCheck` looks, for each (namespace, key, selector) a process decides,
for counters of that (namespace, key) in the old layout, and logs one warning on
the ``ratelimit`` logger when it finds some. It looks for the exact old keys of the first
:data:`LOOKS` identifiers decided (those that come first after an upgrade are the busy
ones, which have old counters) and, the first time, at a sample of the old slot::

    check = LayoutCheck(client)
    check.saw(plan)          # on every decision: a dict lookup; the first few start a look
    check.cancel()           # when the engine closes

The sample is of the one slot the old layout kept that (namespace, key) in: ``CLUSTER
GETKEYSINSLOT <slot> 10`` on the node owning it (a cluster client), or a ``SCAN MATCH``
of at most :data:`SCANNED` keys (a client of one server with ``spread=True``); concurrency
slot sets (``:c``), reset marks (``:r``) and penalties' keys (``:pl``, ``:ph``) found there
are no counters. The look
runs in a background task of its own, kept referenced until it ends; whatever it meets
(a failing server, a command refused) is logged at debug level, never raised.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from ratelimit.backends.naming import encode_part, selector_part, tag
from ratelimit.backends.redis.compat import CLUSTERS
from ratelimit.backends.redis.keys import plan_keys
from ratelimit.core.plan import Plan

logger = logging.getLogger("ratelimit")

SAMPLE = 10
"""Keys asked of the old layout's slot (``CLUSTER GETKEYSINSLOT <slot> 10``)."""
SCANNED = 500
"""Keys a ``SCAN`` looks through at most, on a client of one server."""
LOOK_TIMEOUT = 10.0
"""Seconds one look may take before it is given up (quietly)."""
MAX_SEEN = 10_000
"""(namespace, key, selector) triples looked for at most; more start no look."""
LOOKS = 32
"""Identifiers of one (namespace, key, selector) whose old keys are looked for."""


_SELECTED = re.compile(r"\}:[^:!]*=")
"""A key of an identifier with a selector in the old layout (``rl:{ns:key}:user=...``): a
selector's name and value follow the tag; no key of an identifier of none has an ``=``."""


class LayoutCheck:
    """Warns once per (namespace, key) when counters of the layout before spreading are
    found for a limit that now spreads (see the module). ``client``: the engine's
    ``redis.asyncio.Redis`` or ``RedisCluster`` (or valkey-py's)."""

    __slots__ = ("_client", "_closed", "_seen", "_tasks", "_warned")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._seen: dict[tuple[str, str, str], int] = {}  # looks started per triple
        self._warned: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def saw(self, plan: Plan) -> None:
        """Note a decision of ``plan`` by an engine whose ``spread`` is on: for the first
        :data:`LOOKS` decisions of a (namespace, key, selector) of a tree that spreads made
        in a running event loop, start a look for its counters in the old layout (a
        decision made with no running loop leaves it to a later one). Never raises."""
        compiled = plan.compiled
        if compiled.pinned or not compiled.selectors or self._closed:
            return
        seen = (plan.namespace, plan.key, compiled.selectors[0].partition("#")[0])
        looks = self._seen.get(seen, 0)
        if looks >= LOOKS or (not looks and len(self._seen) >= MAX_SEEN):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop (the sync API's direct path): a later look
            return
        self._seen[seen] = looks + 1
        task = loop.create_task(self._look(plan, not looks))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        """Wait for the looks started so far to end (for tests and a tidy close)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def cancel(self) -> None:
        """Give up the looks still running, and start no more."""
        self._closed = True
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """:meth:`cancel`, and wait until the looks have let go of their connections (an
        engine closing, before it closes its client)."""
        self.cancel()
        loop = asyncio.get_running_loop()
        ours = [task for task in self._tasks if task.get_loop() is loop]
        await asyncio.gather(*ours, return_exceptions=True)

    async def _look(self, plan: Plan, sample: bool) -> None:
        namespace, key = plan.namespace, plan.key
        selector = plan.compiled.selectors[0].partition("#")[0]
        if (namespace, key) in self._warned:
            return
        try:
            async with asyncio.timeout(LOOK_TIMEOUT):
                found = await self._old_keys_of(plan)
                if not found and sample:
                    found = await self._old_keys(namespace, key, selector)
        except Exception as exc:  # a look must never fail a decision, nor be noisy
            logger.debug("ratelimit: looking for counters of the old layout failed: %r", exc)
            return
        if found and (namespace, key) not in self._warned:
            self._warned.add((namespace, key))
            logger.warning("ratelimit: %s", old_layout_warning(namespace, key, selector, found))

    async def _old_keys_of(self, plan: Plan) -> list[str]:
        """Of the keys ``plan``'s identifiers with a selector had in the old layout (one
        slot: the old layout's tag), one that exists (an identifier of no selector is where
        it always was)."""
        client = self._client
        for name in plan_keys(plan, spread=False):
            if not _SELECTED.search(name):
                continue
            if isinstance(client, CLUSTERS):
                await client.initialize()
                node = client.get_node_from_key(name)
                there = await client.execute_command("EXISTS", name, target_nodes=node)
            else:
                there = await client.exists(name)
            if there:
                return [name]
        return []

    async def _old_keys(self, namespace: str, key: str, selector: str) -> list[str]:
        """Keys of ``selector``'s identifiers of (namespace, key) in the old layout, from a
        sample of its slot."""
        pinned = tag(namespace, key)
        prefix = f"{pinned}:{selector_part(selector)}="
        client = self._client
        if isinstance(client, CLUSTERS):
            await client.initialize()
            node = client.get_node_from_key(pinned)
            keys = await client.execute_command(
                "CLUSTER GETKEYSINSLOT", client.keyslot(pinned), SAMPLE, target_nodes=node
            )
            return [k for k in map(_text, keys) if k.startswith(prefix) and _counter(k)]
        found: list[str] = []
        cursor, scanned = 0, 0
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
        while scanned < SCANNED:
            cursor, keys = await client.scan(cursor, match=pattern, count=100)
            scanned += 100
            found += filter(_counter, map(_text, keys))
            if found or not cursor:
                break
        return found


def old_layout_warning(namespace: str, key: str, selector: str, found: list[str]) -> str:
    """The warning :class:`LayoutCheck` logs."""
    return (
        f"namespace {namespace!r}, key {key!r}: counters of the layout before spreading were "
        f"found (such as {found[0]}), which this limiter no longer reads: it keeps each "
        f"{selector}'s counters under a hash tag of its own (spread, the default on a Redis "
        f"Cluster client), {tag(namespace, key)[:-1]}:{encode_part(selector)}=<value>}}. "
        "While processes of both layouts run (a rolling upgrade), and until those counters "
        "expire, each identifier may be admitted up to its limit again, once, over the "
        "rules' longest span. To keep the old layout, set spread=False (RATELIMIT_SPREAD=off "
        "for the command and the service); else let them expire (after the longest span)."
    )


def _counter(key: str) -> bool:
    """Whether ``key`` holds counts: not a concurrency slot set (``:c``: a concurrency limit
    of the key that is pinned today keeps its slots there), a reset mark (``:r``), nor a
    penalty's refusals or hold (``:pl``, ``:ph``: under the key's tag in either layout,
    :mod:`~ratelimit.backends.redis.penalties`)."""
    return not key.endswith((":c", ":r", ":pl", ":ph"))


def _text(key: object) -> str:
    return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else str(key)
