"""The connections the Redis engines borrow from a client's pool: room left, and event loops.

The engines use the application's own client, so they share its pool with the application.
They never take a connection the pool has no room for while one of their own is busy (they
wait for their own instead: back-pressure, not an outage), and they give every connection
back when its work is done.

redis-py's asyncio connections belong to the event loop that opened them. When a loop ends
(``asyncio.run()`` returns, a test's loop closes), the connections it opened are dead, and
redis-py would hand them out again in the next loop, where they fail with "Event loop is
closed". :func:`forget_other_loops` closes such connections without their loop and leaves
them in the pool disconnected, so the pool opens them anew in the running loop;
:func:`forget_other_loops_of` does the same on every node of a ``RedisCluster``.

These helpers read redis-py's pool state (``_in_use_connections``,
``_available_connections``) and a connection's stream (``_reader``, ``_writer``, ``_parser``),
which redis-py has kept from 4.2 to 8; each falls back to doing nothing when they are missing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from typing import Any

from ratelimit.backends.loops import abort_transport
from ratelimit.backends.redis.compat import ConnectionError, MaxConnectionsError


def spare(pool: Any) -> int:
    """How many more connections ``pool`` can hand out now (idle, or room to open one)."""
    in_use = getattr(pool, "_in_use_connections", None)
    most = getattr(pool, "max_connections", None)
    if in_use is None or not isinstance(most, int):
        return 1 << 30  # unknown pool: assume room
    return most - len(in_use)


def pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says the pool had no connection left to hand out (nothing was sent):
    ``MaxConnectionsError``, or on redis-py 5 a ``ConnectionError("Too many connections")``."""
    if isinstance(exc, MaxConnectionsError):
        return True
    return type(exc) in ConnectionError and str(exc) == "Too many connections"


def pool_of(client: Any) -> Any | None:
    """The connection pool of a plain ``redis.asyncio.Redis`` (``None`` for a cluster)."""
    return getattr(client, "connection_pool", None)


def read_timeout(client: Any) -> float:
    """The client's ``socket_timeout`` (how long a read may wait), or ``inf``."""
    pool = pool_of(client)
    options = getattr(pool, "connection_kwargs", None) or getattr(client, "connection_kwargs", {})
    timeout = options.get("socket_timeout") if isinstance(options, dict) else None
    return float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else math.inf


async def close_idle(client: Any) -> None:
    """Close the connections ``client`` holds idle (a ``Redis``'s pool's or its single
    connection, or every node's of a ``RedisCluster``), so that the next calls connect
    anew. Each is closed without waiting (``nowait``), so no other task is handed one
    half closed meanwhile; one in use by another task is left alone. Never raises."""
    with contextlib.suppress(Exception):
        single = getattr(client, "connection", None)
        if single is not None:  # a client of one connection: closed between its commands
            lock = getattr(client, "_single_conn_lock", None)
            async with lock if lock is not None else contextlib.nullcontext():
                await single.disconnect(nowait=True)
        pool = pool_of(client)
        if pool is not None:
            idle = getattr(pool, "_available_connections", None)
            if idle is None:
                await pool.disconnect(inuse_connections=False)
            for connection in tuple(idle or ()):
                await connection.disconnect(nowait=True)
            return
        for node in client.get_nodes():
            for connection in tuple(getattr(node, "_free", ())):
                await connection.disconnect(nowait=True)


def closed_by_server(connection: Any) -> bool:
    """Whether Redis closed ``connection`` (a restart) and the event loop has read that."""
    reader = getattr(connection, "_reader", None)
    return reader is not None and bool(reader.at_eof())


async def drop_closed(client: Any) -> None:
    """Disconnect the idle connections of ``client`` that Redis closed (a restart) and the
    event loop has read that, so that the next command connects anew instead of being
    written to a dead connection: redis-py 8 no longer checks when its pool hands one out.
    A ``Redis``'s pool only. Never raises."""
    pool = pool_of(client)
    idle = getattr(pool, "_available_connections", None) if pool is not None else None
    for connection in tuple(idle or ()):
        if connection.is_connected and closed_by_server(connection):
            with contextlib.suppress(Exception):
                await connection.disconnect(nowait=True)


def forget_other_loops_of(client: Any) -> int:
    """:func:`forget_other_loops` for a client: the pool of a ``Redis``, or the connections
    of every node of a ``RedisCluster``. Returns how many were forgotten."""
    pool = pool_of(client)
    if pool is not None:
        return forget_other_loops(pool)
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return 0
    nodes = {
        id(node): node
        for table in (getattr(manager, "nodes_cache", {}), getattr(manager, "startup_nodes", {}))
        for node in table.values()
    }
    running = asyncio.get_running_loop()
    return sum(  # a node opens a forgotten connection again on its next use
        _forget(connection, running)
        for node in nodes.values()
        for connection in getattr(node, "_connections", ())
    )


def forget_other_loops(pool: Any) -> int:
    """Disconnect, without their loop, the connections of ``pool`` opened in an event loop
    that is not running (it ended, or waits idle); those a dead task held go back to the
    pool. Returns how many were forgotten."""
    available = getattr(pool, "_available_connections", None)
    in_use = getattr(pool, "_in_use_connections", None)
    if available is None or in_use is None:
        return 0
    running = asyncio.get_running_loop()
    for name in ("_lock", "_condition"):  # a lock that waited in the old loop is bound to it
        lock: Any = getattr(pool, name, None)
        bound = getattr(lock, "_loop", None)
        if bound is not None and bound is not running and not bound.is_running():
            setattr(pool, name, type(lock)())
    forgotten = 0
    for connection in [*available, *in_use]:
        if _forget(connection, running):
            forgotten += 1
            if connection in in_use:  # its holder died with its loop
                in_use.remove(connection)
                available.append(connection)
    return forgotten


def _forget(connection: Any, running: asyncio.AbstractEventLoop) -> bool:
    """Disconnect ``connection`` if a loop other than ``running``, and not running itself
    (ended, or idle), opened it; say whether it did."""
    reader = getattr(connection, "_reader", None)
    loop = getattr(reader, "_loop", None)
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop is running:
        return False
    if loop.is_running() and not loop.is_closed():
        return False
    _abandon(connection, loop)
    return True


def _abandon(connection: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Close a connection's socket outside its loop and mark it disconnected."""
    abort_transport(getattr(getattr(connection, "_writer", None), "transport", None), loop)
    parser = getattr(connection, "_parser", None)
    if parser is not None:
        with contextlib.suppress(Exception):
            parser.on_disconnect()
    connection._reader = None
    connection._writer = None


class ConnectionGate:
    """At most as many Redis commands of one engine in flight as its client's pool has
    connections: callers past that wait for a slot (back-pressure) instead of failing with
    "Too many connections". No bound for a pool without a limit, or for a cluster.

    ``slot(first=True)`` goes ahead of every ``slot()`` waiting: what frees a resource
    others wait for (the command engine's lock release) never queues behind those waiting
    to take it. Each kind is served first come, first served.

    Example::

        gate = ConnectionGate(client)
        async with gate.slot():
            await client.get("x")
    """

    def __init__(self, client: Any) -> None:
        pool = pool_of(client)
        most = getattr(pool, "max_connections", None)
        # A gate serves one event loop (its futures): its owner makes a new one in a new loop.
        self.size: int | None = most if isinstance(most, int) and 0 < most < 1 << 20 else None
        self._free = self.size or 0
        self._first: collections.deque[asyncio.Future[None]] = collections.deque()
        self._others: collections.deque[asyncio.Future[None]] = collections.deque()

    def slot(self, *, first: bool = False) -> contextlib.AbstractAsyncContextManager[object]:
        """Hold one connection's worth of the pool for the block (``first``: ahead of the
        others waiting)."""
        if self.size is None:
            return contextlib.nullcontext()
        return _Slot(self, first)

    async def _take(self, first: bool) -> None:
        if self._free > 0 and not self._first and (first or not self._others):
            self._free -= 1
            return
        queue = self._first if first else self._others
        granted = asyncio.get_running_loop().create_future()
        queue.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._give()  # handed a slot while being cancelled: pass it on
            elif granted in queue:  # a _give() may have dropped it once cancelled
                queue.remove(granted)
            raise

    def _give(self) -> None:
        for queue in (self._first, self._others):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot passes straight to it
                    return
        self._free += 1


class _Slot:
    __slots__ = ("_first", "_gate")

    def __init__(self, gate: ConnectionGate, first: bool) -> None:
        self._gate = gate
        self._first = first

    async def __aenter__(self) -> None:
        await self._gate._take(self._first)

    async def __aexit__(self, *exc: object) -> None:
        self._gate._give()
