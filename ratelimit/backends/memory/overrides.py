"""Overrides kept in this process's memory (:class:`~ratelimit.backends.base.OverrideStore`
for :class:`~ratelimit.backends.memory.backend.MemoryBackend`): per namespace, a version and a
table, as the other stores keep them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ratelimit.backends.base import ANNOUNCED_FOR, announced_before, stamped
from ratelimit.errors import LimiterClosedError

_ANNOUNCED = "key:"


class OverrideTables:
    """A mixin: the memory backend's overrides. Its host sets ``_closed`` and ``clock``
    (injected, else ``None``: the time of day dates announcements)."""

    _closed: bool
    clock: Callable[[], float] | None
    _override_tables: dict[str, tuple[list[int], dict[str, str], dict[str, float]]]

    def _table(self, namespace: str) -> tuple[list[int], dict[str, str], dict[str, float]]:
        if self._closed:
            raise LimiterClosedError("this memory backend")
        tables = self.__dict__.setdefault("_override_tables", {})
        return tables.setdefault(namespace, ([0], {}, {}))  # type: ignore[no-any-return]

    async def overrides_version(self, namespace: str) -> int:
        return self._table(namespace)[0][0]

    async def overrides_load(self, namespace: str) -> tuple[int, dict[str, str]]:
        version, table, _ = self._table(namespace)
        return version[0], dict(table)

    async def overrides_write(
        self, namespace: str, identity: str, record: str | None, expires: float | None
    ) -> bool:
        version, table, expiry = self._table(namespace)
        existed = identity in table
        version[0] += 1
        if record is None:
            table.pop(identity, None)
            expiry.pop(identity, None)
        else:
            table[identity] = stamped(record, version[0])
            if expires is None:
                expiry.pop(identity, None)
            else:
                expiry[identity] = expires
        return existed

    async def overrides_announce(self, namespace: str, keys: Sequence[str]) -> None:
        table = self._table(namespace)[1]
        at = repr((self.clock or time.time)())
        for key in keys:
            table[_ANNOUNCED + key] = at

    async def overrides_prune(self, namespace: str, now: float) -> int:
        version, table, expiry = self._table(namespace)
        expired = [identity for identity, at in expiry.items() if at <= now]
        for identity in expired:
            del table[identity], expiry[identity]
        if expired:
            version[0] += 1
        horizon = (self.clock or time.time)() - ANNOUNCED_FOR
        for identity in [i for i, at in table.items() if i.startswith(_ANNOUNCED)]:
            if announced_before(table[identity], horizon):
                del table[identity]
        return len(expired)
