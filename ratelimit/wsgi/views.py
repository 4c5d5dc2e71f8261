"""What the Flask and Django view decorators share: :class:`ViewLimit`, one view's limit
decided for a WSGI request with the framework's values (path parameters, the JSON body),
and :func:`captured`, a WSGI application's answer as status, headers and body, so that the
frameworks answer a refusal with the middleware's own (problem details, or ``refused=``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.types import WSGIApplication, WSGIEnvironment

from ratelimit.asgi.limits import HTTPCost, HTTPCountWhen, HTTPLimit, HTTPResponse
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest
from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.rules.tree import RuleLike
from ratelimit.sync.limiter import RateLimit
from ratelimit.wsgi.environ import scope_of
from ratelimit.wsgi.middleware import DECISIONS, STATE, check_limiter
from ratelimit.wsgi.response import ExcInfo


def no_application(environ: WSGIEnvironment, start_response: object) -> Iterable[bytes]:
    """The application of a middleware kept only for its routes and refusals (the Flask
    helper's checked settings, the Django middleware's), which serves nothing."""
    raise RuntimeError("this WSGI middleware is kept for its routes and serves no application")


class ViewLimit:
    """A limit on one view, checked when made: ``rules``, ``key``, ``cost``, ``shadow``,
    ``penalty`` and ``count_when`` as for :class:`~ratelimit.asgi.Route`, ``sources`` as its
    ``**sources`` (body fields included: ``json_field``), ``proxies`` the client address's
    trusted proxies. ``where`` names it in error messages."""

    __slots__ = ("limit", "limiter", "needs_body", "needs_user", "proxies")

    def __init__(
        self,
        limiter: RateLimit,
        rules: RuleLike,
        key: str | None,
        cost: HTTPCost,
        shadow: bool | None,
        proxies: TrustedProxies,
        sources: dict[str, Any],
        where: str,
        penalty: str | None = None,
        count_when: HTTPCountWhen | None = None,
    ) -> None:
        check_limiter(limiter, where)
        self.limit = HTTPLimit(
            rules, key, cost, shadow, sources, where, True, None, penalty, count_when
        )
        self.limit.check(limiter.limiter)
        self.limiter = limiter
        self.proxies = proxies
        given = self.limit.sources.values()
        self.needs_body = any(source.needs_body for source in given)
        self.needs_user = any(source.what.startswith("user(") for source in given)

    def decide(
        self,
        environ: WSGIEnvironment,
        key: str,
        path_params: Mapping[str, Any] | None = None,
        read_json: Callable[[], Any] | None = None,
        user: Any = None,
    ) -> Decision:
        """Decide one request under this limit's key, else ``key`` (the view's): the
        decision when admitted (or in shadow mode), else ``RateLimitExceeded``. A selector
        value its source cannot read raises ``SourceValueError``. ``read_json``: reads the
        body as JSON, called here (in the request's thread) when a source needs it. The
        decision joins ``environ[DECISIONS]`` when a middleware made it (whose response
        then carries its headers), and is ``environ[STATE]``. ``user``: the authenticated
        user ``user()`` sources read (default: ``REMOTE_USER``)."""
        body = None
        if self.needs_body and read_json is not None:
            try:
                parsed = read_json()
            except (ValueError, UnicodeDecodeError):
                parsed = None

            async def body() -> Any:
                return parsed

        params = {name: str(value) for name, value in (path_params or {}).items()}
        scope = scope_of(environ)
        if user is not None:
            scope["user"] = user
        request = HTTPRequest(scope, self.proxies, params, body)
        limit, chosen = self.limit, self.limit.key or key
        decision = self.limiter.run(lambda limiter: limit.decide(limiter, request, chosen))
        environ[STATE] = decision
        decisions = environ.get(DECISIONS)
        if isinstance(decisions, list):
            decisions.append(decision)
        if decision.allowed or decision.shadow:
            return decision
        raise RateLimitExceeded(decision)

    def settled(
        self,
        environ: WSGIEnvironment,
        decision: Decision,
        status: int,
        headers: Iterable[tuple[str, str]],
    ) -> None:
        """What the view's response (``status``, ``headers``) says of the request it
        decided: refunded when ``count_when`` does not count it. Never raises (logged)."""
        if self.limit.count_when is None:
            return
        request = HTTPRequest(scope_of(environ), self.proxies)
        raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
        response = HTTPResponse.of({"status": status, "headers": raw})
        limit = self.limit
        self.limiter.run(lambda limiter: limit.settled(limiter, request, response, decision))


def captured(
    application: WSGIApplication, environ: WSGIEnvironment
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Run a WSGI ``application`` (a refusal) and return its status code, headers and
    body."""
    started: list[tuple[str, list[tuple[str, str]]]] = []
    written: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: ExcInfo = None
    ) -> Callable[[bytes], object]:
        started[:] = [(status, list(headers))]
        return written.append

    result: Iterable[bytes] = application(environ, start_response)
    try:
        written.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started[0]
    return int(status.split(None, 1)[0]), headers, b"".join(written)
