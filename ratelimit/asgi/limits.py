"""What a middleware route and a route dependency share: rules, key, cost, shadow flag and
selector sources, checked when made, and one request's decision through the pipeline."""

from __future__ import annotations

from typing import Any

from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.sources import Source, resolve, sources_for
from ratelimit.decision import Decision
from ratelimit.limiter import RateLimit
from ratelimit.plan import CompiledTree, compile_tree
from ratelimit.rules import RuleLike, to_tree


class HTTPLimit:
    """One HTTP limit. ``where`` names it in error messages; ``body``: whether its sources
    may read the request body (a dependency's may, the middleware's may not)."""

    __slots__ = ("compiled", "cost", "key", "shadow", "sources")

    def __init__(
        self,
        rules: RuleLike,
        key: str | None,
        cost: float,
        shadow: bool | None,
        sources: dict[str, Any],
        where: str,
        body: bool,
    ) -> None:
        if key is not None and (not isinstance(key, str) or not key):
            raise TypeError(f"{where}: key must be non-empty text, not {key!r}")
        if shadow is not None and not isinstance(shadow, bool):
            raise TypeError(f"{where}: shadow must be True or False, not {shadow!r}")
        self.compiled: CompiledTree = compile_tree(to_tree(rules))
        self.key = key
        self.cost = cost
        self.shadow = shadow
        self.sources: dict[str, Source] = sources_for(self.compiled, sources, where, body)

    def check(self, limiter: RateLimit) -> None:
        """The limiter's algorithm can admit a request of this cost under these rules."""
        if not isinstance(limiter, RateLimit):
            raise TypeError(f"limiter must be a ratelimit.RateLimit, not {type(limiter).__name__}")
        limiter.check(self.compiled, self.cost)

    async def decide(self, limiter: RateLimit, request: HTTPRequest, key: str) -> Decision:
        """One request's decision under ``key`` (the limiter's shadow setting unless this
        limit has its own)."""
        compiled = self.compiled
        values = (
            await resolve(compiled.selectors, self.sources, request) if compiled.selectors else ()
        )
        return await limiter.decide(compiled, key, values, cost=self.cost, shadow=self.shadow)
