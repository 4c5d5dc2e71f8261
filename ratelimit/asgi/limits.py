"""What a middleware route and a route dependency share: rules, key, cost, shadow flag and
selector sources, checked when made, and one request's decision through the pipeline; and
what settles a route's request from its response (a header, or a callable).

``cost``: a number or a mapping from units to amounts (checked when made), or a callable
(sync or async) of the :class:`~ratelimit.asgi.HTTPRequest` returning one (checked at each
request). ``settle`` (middleware routes): the name of a response header holding the real
cost (``"x-tokens-used"``: a number; for rules that count one unit, that unit's amount),
or a callable (sync or async) of the request and the :class:`HTTPResponse` returning it
(``None``: the reservation stands).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ratelimit.asgi.header_map import HeaderMap
from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.sources import Source, Values, client_ip, resolve, resolve_now, sources_for
from ratelimit.core.costs import CostValue, units
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.errors import ConfigurationError, RateLimitError
from ratelimit.front.limiter import RateLimit
from ratelimit.overrides.cache import Override
from ratelimit.overrides.lowered import Overriding, lowered, never
from ratelimit.penalties.spec import checked_penalty
from ratelimit.rules.tree import RuleLike, to_tree

logger = logging.getLogger("ratelimit.asgi")


@dataclass(frozen=True, slots=True)
class HTTPResponse:
    """What a ``settle`` callable reads of the response: its ``status`` and ``headers``
    (names in any case, as HTTP's are; repeated ones joined with ``", "``; see
    :class:`~ratelimit.asgi.header_map.HeaderMap`), as the application started it."""

    status: int
    headers: Mapping[str, str]

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> HTTPResponse:
        """The response an ASGI ``http.response.start`` message starts."""
        return cls(int(message["status"]), HeaderMap(message.get("headers", ())))


HTTPCost: TypeAlias = "CostValue | Callable[[HTTPRequest], CostValue | Awaitable[CostValue]]"
"""A route's ``cost=``: fixed, or a callable of the request."""
HTTPSettle: TypeAlias = (
    "str | Callable[[HTTPRequest, HTTPResponse], CostValue | Awaitable[CostValue | None] | None]"
)
"""A route's ``settle=``: a response header's name, or a callable of request and response."""
HTTPCountWhen: TypeAlias = (
    "Container[int] | Callable[[HTTPRequest, HTTPResponse], bool | Awaitable[bool]]"
)
"""A route's ``count_when=``: the statuses whose requests count (``range(500, 600)``,
``{401, 403}``), or a callable of request and response saying whether it counts."""


def check_async_limiter(limiter: object) -> None:
    """``limiter`` is the async :class:`ratelimit.RateLimit` an ASGI app decides with; a
    ``TypeError`` naming what it is (the threaded ``ratelimit.sync.RateLimit``, say) if not."""
    if isinstance(limiter, RateLimit):
        return
    kind = type(limiter)
    if kind.__module__.startswith("ratelimit.sync") and kind.__name__ == "RateLimit":
        raise TypeError(
            "limiter must be a ratelimit.RateLimit (async: an ASGI app decides in its event "
            "loop), not a ratelimit.sync.RateLimit, which is for threaded code (WSGI, Flask, "
            "Django: ratelimit.wsgi, ratelimit.flask, ratelimit.django)"
        )
    raise TypeError(
        f"limiter must be a ratelimit.RateLimit, not {kind.__module__}.{kind.__qualname__}"
    )


def _count_when(
    given: HTTPCountWhen | None, where: str
) -> Callable[[HTTPRequest, HTTPResponse], bool | Awaitable[bool]] | None:
    """``count_when=`` as a callable of request and response (statuses: whether the
    response's is one of them), checked."""
    if given is None or callable(given):
        return given
    if isinstance(given, Container) and not isinstance(given, str | bytes):
        statuses = given
        if not any(isinstance(status, int) and status in statuses for status in range(100, 600)):
            raise ConfigurationError(
                f"{where}: count_when holds no HTTP status (100 to 599): {given!r}"
            )
        return lambda request, response: response.status in statuses
    raise TypeError(
        f"{where}: count_when must be the statuses whose requests count (range(500, 600), "
        f"{{401, 403}}) or a callable of the request and the response, not {given!r}"
    )


class HTTPLimit:
    """One HTTP limit. ``where`` names it in error messages; ``body``: whether its sources
    may read the request body (a dependency's may, the middleware's may not)."""

    __slots__ = (
        "compiled", "cost", "count_when", "given_cost", "key", "penalty", "settle", "shadow",
        "sources",
    )  # fmt: skip

    def __init__(
        self,
        rules: RuleLike,
        key: str | None,
        cost: HTTPCost,
        shadow: bool | None,
        sources: dict[str, Any],
        where: str,
        body: bool,
        settle: HTTPSettle | None = None,
        penalty: str | None = None,
        count_when: HTTPCountWhen | None = None,
    ) -> None:
        self.count_when = _count_when(count_when, where)
        if key is not None and (not isinstance(key, str) or not key):
            raise TypeError(f"{where}: key must be non-empty text, not {key!r}")
        if shadow is not None and not isinstance(shadow, bool):
            raise TypeError(f"{where}: shadow must be True or False, not {shadow!r}")
        if settle is not None and not (isinstance(settle, str) and settle) and not callable(settle):
            raise TypeError(
                f"{where}: settle must be a response header's name or a callable of the "
                f"request and the response, not {settle!r}"
            )
        self.compiled: CompiledTree = compile_tree(to_tree(rules))
        self.key = key
        self.cost: Any = cost  # as check() returns it, or a callable of the request
        self.given_cost: Any = cost  # as given: what an override's rules are checked with
        self.settle = settle.lower() if isinstance(settle, str) else settle
        self.shadow = shadow
        self.sources: dict[str, Source] = sources_for(self.compiled, sources, where, body)
        self.penalty = checked_penalty(penalty, self.compiled, where)

    def check(self, limiter: RateLimit) -> None:
        """The limiter's algorithm can admit a request of this cost under these rules (a
        callable's costs are checked at each request)."""
        check_async_limiter(limiter)
        if not callable(self.cost) or isinstance(self.cost, Mapping):
            self.cost = limiter.check(self.compiled, self.cost)
        if self.penalty is not None:
            limiter.penalties.check()
        if self.count_when is not None:  # it refunds by a settle
            limiter.check_settling()

    @property
    def settles(self) -> bool:
        """Whether the response may change what the request counts: ``settle`` or
        ``count_when`` (:meth:`settled`)."""
        return self.settle is not None or self.count_when is not None

    async def decide(self, limiter: RateLimit, request: HTTPRequest, key: str) -> Decision:
        """One request's decision under ``key`` (the limiter's shadow setting unless this
        limit has its own), under the override in force for its values if one is."""
        compiled = self.compiled
        values: Values = ()
        if compiled.selectors:
            read = resolve_now(compiled.selectors, self.sources, request)
            values = read if read.__class__ is tuple else await read  # type: ignore[misc]
        overrides = limiter.overrides
        found = (
            None
            if overrides.quiet(key)
            else await overrides.find(key, dict(zip(compiled.selectors, values, strict=True)))
        )
        if found is not None:
            try:
                return await self._decide_overridden(limiter, request, key, found, values)
            except (ConfigurationError, ValueError, TypeError) as exc:
                logger.warning(
                    "ratelimit: override %s not applied; key %r keeps its own rules: %s",
                    found,
                    key,
                    exc,
                )
        cost = self.cost
        override: Overriding = False
        if callable(cost) and not isinstance(cost, Mapping):
            cost = await self._cost_of(request)
            try:
                cost = limiter.check(compiled, cost)
            except ConfigurationError:  # a request's cost its rules never admit: refused
                beyond = never(compiled, limiter.namespace, key, values, cost, limiter.algorithm)
                if beyond is None:
                    raise
                cost, override = beyond
        return await limiter.decide(
            compiled,
            key,
            values,
            cost=cost,
            shadow=self.shadow,
            penalty=self.penalty,
            override=override,
        )

    async def _decide_overridden(
        self,
        limiter: RateLimit,
        request: HTTPRequest,
        key: str,
        found: Override,
        values: tuple[str | None, ...],
    ) -> Decision:
        """The decision under ``found``'s rules, whose selectors this route's sources (or
        ``ip``, the client's address) give; ``ConfigurationError`` where they cannot."""
        tree = limiter.overrides.rules_of(found, key, self.compiled)
        named = dict(zip(self.compiled.selectors, values, strict=True))
        missing = tuple(name for name in tree.selectors if name not in named)
        if missing:
            sources = {name: self.sources.get(name) or client_ip() for name in missing}
            unknown = [n for n in missing if n not in self.sources and n != "ip"]
            if unknown:
                raise ConfigurationError(f"this route gives no source for {', '.join(unknown)}")
            named.update(zip(missing, await resolve(missing, sources, request), strict=True))
        cost = self.given_cost
        if callable(cost) and not isinstance(cost, Mapping):
            cost = await self._cost_of(request)
        own = tuple(named[name] for name in tree.selectors)
        override: Overriding = True
        try:
            checked = limiter.check(tree, cost)
        except ConfigurationError:  # perhaps lowered below the request's cost: refused
            found_lowered = lowered(tree, limiter.namespace, key, own, cost, limiter.algorithm)
            if found_lowered is None:
                raise
            checked, override = found_lowered
        return await limiter.decide(
            tree,
            key,
            own,
            cost=checked,
            shadow=self.shadow,
            override=override,
            penalty=self.penalty,
            penalty_of=(self.compiled, values),  # what the penalty holds back: its own rules'
        )

    async def _cost_of(self, request: HTTPRequest) -> CostValue:
        cost = self.given_cost(request)
        if inspect.isawaitable(cost):
            cost = await cost
        return cost  # type: ignore[no-any-return]

    async def settled(
        self, limiter: RateLimit, request: HTTPRequest, response: HTTPResponse, decision: Decision
    ) -> None:
        """Settle ``decision`` from ``response``: refunded whole when ``count_when`` says the
        request does not count; else as ``settle`` says (a response that says nothing
        leaves the reservation). Never raises: the response is under way; what goes wrong
        is logged."""
        if not self.settles or not decision.allowed or decision.degraded:
            return
        try:
            if self.count_when is not None:
                counts = self.count_when(request, response)
                if inspect.isawaitable(counts):
                    counts = await counts
                if not counts:
                    await limiter.settle(decision, 0)
                    return
            if self.settle is None:
                return
            if isinstance(self.settle, str):
                actual = self._from_header(response.headers.get(self.settle))
            else:
                answer = self.settle(request, response)
                actual = await answer if inspect.isawaitable(answer) else answer
            if actual is not None:
                await limiter.settle(decision, actual)
        except (RateLimitError, ValueError, TypeError) as exc:
            logger.warning("ratelimit: request of key %r not settled: %s", decision.key, exc)

    def _from_header(self, text: str | None) -> CostValue | None:
        """A settle header's number: the amount of the rules' one unit, else the cost on
        every rule; ``None`` when absent."""
        if text is None:
            return None
        number = float(text.strip())
        amount = int(number) if number.is_integer() else number
        counted: Sequence[str] = units(self.compiled)
        return {counted[0]: amount} if len(counted) == 1 else amount
