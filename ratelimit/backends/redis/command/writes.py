"""The writes of one command-engine step on a Redis Cluster, one transaction per hash tag.

A step's keys may lie under several hash tags (a call whose identifiers spread:
:mod:`~ratelimit.backends.redis.spanning`), which a cluster keeps in slots of their own, and
one ``MULTI`` cannot span slots. :class:`Writes` takes each write as a pipeline would
(``writes.lpush(key, ...)``: every command the engine writes names its key first) and
queues it in the transaction of its key's tag; :meth:`Writes.execute` runs them one after
the other. The step holds the lock of every tag it writes, so no other step reads between
them; a failure between two leaves the first written (refusing sooner, never admitting
more: what was written are hits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ratelimit.backends.redis.client import RedisClient


class Writes:
    """Transactions per hash tag, filled as one pipeline (see the module)."""

    __slots__ = ("_by_tag", "_client")

    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self._by_tag: dict[str, Any] = {}

    def __getattr__(self, command: str) -> Callable[..., Any]:
        def queued(key: str, *args: Any, **kwargs: Any) -> Any:
            return getattr(self._on(key), command)(key, *args, **kwargs)

        return queued

    def _on(self, key: str) -> Any:
        start = key.find("{")
        tag = key[start : key.find("}", start) + 1] if start >= 0 else key
        pipe = self._by_tag.get(tag)
        if pipe is None:
            pipe = self._by_tag[tag] = self._client.pipeline(transaction=True)
        return pipe

    def __len__(self) -> int:
        return sum(len(pipe) for pipe in self._by_tag.values())

    async def execute(self) -> list[Any]:
        """Run each tag's transaction in turn; their replies, one after the other."""
        replies: list[Any] = []
        for pipe in self._by_tag.values():
            replies += await pipe.execute()
        return replies
