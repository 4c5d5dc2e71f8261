"""Redis Sentinel: ``redis+sentinel://`` URLs, and finding the primary apart from any one
decision's deadline.

redis-py asks the sentinels where the primary is each time it opens a connection
(``SentinelManagedConnection.connect`` -> ``SentinelConnectionPool.get_master_address`` ->
``Sentinel.discover_master``), inside the caller's own await, so a decision's deadline
cancels the search. It asks the sentinels one after another, each with the client's retries
(about 4 s of back-off for a sentinel that refuses connections) and no socket timeout
(forever, for one that is paused), so with the first sentinel down the search never ended
within a 0.25 s decision: every call failed open for as long as that sentinel stayed down.

:class:`SentinelDiscovery` (a redis-py ``Sentinel``) searches in a task of its own, shared by
every connection that needs the primary meanwhile. A caller waits for it within its own
deadline; cancelling the caller leaves the task running, so the next call finds its answer.
The sentinels are asked in turn, the one that answered last first: each has
:data:`ASK_NEXT_AFTER` seconds to answer before the next one is asked as well (a slow one is
not abandoned: the first good answer wins), and each query has its own connect and socket
timeouts (:data:`SENTINEL_TIMEOUT`, no retries), so a dead sentinel is skipped at once and a
paused one after :data:`ASK_NEXT_AFTER`. The primary found is remembered: when no sentinel
answers at all, connections go to the last primary found instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff

from ratelimit.backends.redis.schemes import SENTINEL_SCHEME as SENTINEL_SCHEME
from ratelimit.errors import ConfigurationError

SENTINEL_PORT = 26379
ASK_NEXT_AFTER = 0.1
"""Seconds a sentinel has to answer before the next one is asked too."""
SENTINEL_TIMEOUT = 1.0
"""Connect and socket timeout of each query to a sentinel (``sentinel_kwargs`` may change
it); a query is not retried: the next sentinel is asked instead."""

logger = logging.getLogger("ratelimit")


class SentinelURL:
    """The parts of ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``,
    user and password percent-decoded as redis-py's ``from_url`` decodes them for
    ``redis://``. ``ConfigurationError`` names what is wrong."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        names = [name for name in parts.path.split("/") if name]
        self.hosts: list[tuple[str, int]] = []
        for host in parts.netloc.rpartition("@")[2].split(","):
            name, _, port = host.partition(":")
            if not name or (port and not port.isdigit()) or int(port or 1) > 65535:
                raise ConfigurationError(
                    f"a redis+sentinel:// URL's sentinels are host:port, not {host!r}"
                )
            self.hosts.append((name, int(port or SENTINEL_PORT)))
        if not names or len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
            raise ConfigurationError(
                "a redis+sentinel:// URL names the service, and may name a database: "
                "redis+sentinel://host:26379/mymaster/0"
            )
        self.service = names[0]
        self.db = int(names[1]) if len(names) == 2 else 0
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None


def sentinel_client(url: str, **options: Any) -> aioredis.Redis:
    """The primary of a Sentinel-watched service, found anew after a failover:
    ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`` (the scheme
    ``limits`` uses; port 26379 when left out; user and password percent-encoded). The user
    and password are the primary's; ``sentinel_kwargs=`` (a dict) configures the
    connections to the sentinels (by default: :data:`SENTINEL_TIMEOUT`, no retries); the
    other ``options`` go to ``Sentinel.master_for``."""
    parsed = SentinelURL(url)
    sentinel = SentinelDiscovery(parsed.hosts, sentinel_kwargs=options.pop("sentinel_kwargs", None))
    if parsed.username is not None:
        options.setdefault("username", parsed.username)
    if parsed.password is not None:
        options.setdefault("password", parsed.password)
    client: aioredis.Redis = sentinel.master_for(parsed.service, db=parsed.db, **options)
    return client


class SentinelDiscovery(Sentinel):
    """A redis-py ``Sentinel`` that finds a service's primary in a shared task of its own,
    asking its sentinels in turn with a short timeout each (see the module's docstring).

    Example::

        sentinel = SentinelDiscovery([("s1", 26379), ("s2", 26379)], sentinel_kwargs=None)
        client = sentinel.master_for("mymaster")
    """

    def __init__(
        self, sentinels: list[tuple[str, int]], *, sentinel_kwargs: dict[str, Any] | None
    ) -> None:
        defaults: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT,
            "socket_connect_timeout": SENTINEL_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),
        }
        super().__init__(sentinels, sentinel_kwargs={**defaults, **(sentinel_kwargs or {})})  # type: ignore[no-untyped-call, unused-ignore]
        self.primaries: dict[str, tuple[str, int]] = {}
        """Per service, the primary found last."""
        self._searches: dict[str, asyncio.Task[tuple[str, int]]] = {}
        self._queries: set[asyncio.Task[Any]] = set()

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        """The address of ``service_name``'s primary: the search under way, or a new one.
        Cancelling the caller does not cancel the search."""
        loop = asyncio.get_running_loop()
        search = self._searches.get(service_name)
        if search is None or search.done() or search.get_loop() is not loop:
            search = loop.create_task(self._search(service_name))
            search.add_done_callback(_consume)  # failed with nobody left waiting: no warning
            self._searches[service_name] = search
        return await asyncio.shield(search)

    async def _search(self, service: str) -> tuple[str, int]:
        waiting = list(self.sentinels)  # the one that answered last first
        asked: dict[asyncio.Task[Any], Any] = {}
        errors: list[str] = []
        answered = False
        try:
            while waiting or asked:
                if waiting:
                    sentinel = waiting.pop(0)
                    query = asyncio.ensure_future(sentinel.sentinel_masters())
                    self._queries.add(query)
                    query.add_done_callback(self._queries.discard)
                    asked[query] = sentinel
                done, _ = await asyncio.wait(
                    asked,
                    timeout=ASK_NEXT_AFTER if waiting else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for query in done:
                    sentinel = asked.pop(query)
                    failure = query.exception()
                    if failure is not None:
                        errors.append(f"{_address(sentinel)}: {failure!r}")
                        continue
                    answered = True
                    masters = query.result()
                    state = masters.get(service) if isinstance(masters, dict) else None
                    if state and self.check_master_state(state, service):
                        self.sentinels.remove(sentinel)
                        self.sentinels.insert(0, sentinel)  # asked first next time
                        address = (state["ip"], int(state["port"]))
                        self.primaries[service] = address
                        return address
                    errors.append(f"{_address(sentinel)}: no primary of {service!r} up")
        finally:
            for query in asked:  # slower sentinels: no longer needed
                query.cancel()
        last = self.primaries.get(service)
        if not answered and last is not None:
            logger.warning(
                "ratelimit: no sentinel answered (%s); using the primary found last, %s:%s",
                "; ".join(errors),
                *last,
            )
            return last
        raise MasterNotFoundError(f"No master found for {service!r} : {'; '.join(errors)}")

    async def aclose(self) -> None:
        """Stop the searches and queries under way (of the running event loop) and close
        the connections to the sentinels."""
        loop = asyncio.get_running_loop()
        pending = [
            task
            for task in (*self._searches.values(), *self._queries)
            if not task.done() and task.get_loop() is loop
        ]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        self._searches.clear()
        for connection in self.sentinels:
            await connection.aclose()


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _address(sentinel: Any) -> str:
    kwargs = sentinel.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"
