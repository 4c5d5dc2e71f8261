"""The sync API's overrides: :class:`ratelimit.overrides.handle.Overrides`, blocking."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ratelimit.front.limiter import RateLimit as AsyncRateLimit
from ratelimit.overrides.cache import Override
from ratelimit.rules.tree import RuleLike

T = TypeVar("T")


class RateLimit(Protocol):
    """What these read of ``ratelimit.sync.RateLimit``: its ``run``."""

    def run(self, make: Callable[[AsyncRateLimit], Coroutine[Any, Any, T]]) -> T: ...


class Overrides:
    """:class:`ratelimit.overrides.handle.Overrides`, blocking."""

    def __init__(self, limiter: RateLimit) -> None:
        self._limiter = limiter

    def set(
        self, key: str, rules: RuleLike, /, *, ttl: float | None = None, **values: str | int
    ) -> Override:
        """Set the rules of ``key`` for these selector values (none: every call of the key),
        for ``ttl`` seconds or until deleted; the new :class:`~ratelimit.Override`."""
        return self._limiter.run(lambda rl: rl.overrides.set(key, rules, ttl=ttl, **values))

    def get(self, key: str, /, **values: str | int) -> Override | None:
        """The override of ``key`` for exactly these values, or ``None``."""
        return self._limiter.run(lambda rl: rl.overrides.get(key, **values))

    def delete(self, key: str, /, **values: str | int) -> bool:
        """Delete the override of ``key`` for these values; whether there was one."""
        return self._limiter.run(lambda rl: rl.overrides.delete(key, **values))

    def list(self, key: str | None = None) -> Sequence[Override]:
        """The overrides in force, of ``key`` or of every key."""
        return self._limiter.run(lambda rl: rl.overrides.list(key))

    def in_force(self, key: str, /, **values: str | int | None) -> Override | None:
        """The override a call of ``key`` with these values decides under, or ``None``."""
        return self._limiter.run(lambda rl: rl.overrides.in_force(key, **values))

    def refresh(self) -> None:
        """Read the overrides from the store now, not at the next refresh."""
        self._limiter.run(lambda rl: rl.overrides.refresh())

    def find(self, key: str, values: Mapping[str, str | None]) -> Override | None:
        """As :meth:`in_force`, from the cache the decisions read."""
        return self._limiter.run(lambda rl: rl.overrides.find(key, values))
