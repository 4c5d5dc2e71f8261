"""Flask: :class:`FlaskRateLimit` puts the WSGI middleware in front of an application (its
app-wide routes, headers and refusals) and limits single views with the request's values.

Example::

    from flask import Flask
    from ratelimit.flask import FlaskRateLimit, Route, header, json_field
    from ratelimit.sync import RateLimit

    app = Flask(__name__)
    rl = RateLimit.from_url("redis://localhost:6379")
    limits = FlaskRateLimit(rl, app, routes=[Route("/ping", "ip:5/m")], exclude=["/health"])

    @app.post("/login")
    @limits.limit("username:3/m", username=json_field("username"))
    def login(): ...

A refused view never runs: Flask answers 429 with ``Retry-After`` and problem details (503
when the storage failed under ``on_error="deny"``), the middleware's answer (or its
``refused=``), with ``RateLimit-Policy`` / ``RateLimit`` headers on every response a limit
decided. A ``RateLimitExceeded`` a view raises (a ``@rl.limit`` function of
:mod:`ratelimit.sync` that it calls) is answered the same, not as Flask's 500.
"""

from __future__ import annotations

import functools
import inspect
import io
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ratelimit.core.extras import needs_extra

with needs_extra("flask"):
    import flask
    from werkzeug.exceptions import HTTPException
    from werkzeug.wrappers import Response

from ratelimit.asgi.headers import problem_headers, unreadable
from ratelimit.asgi.limits import HTTPCost, HTTPCountWhen
from ratelimit.asgi.proxies import TrustedProxies
from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.routes import LIMITED_VIEW, VIEW_LIMITED, Route, view_key
from ratelimit.asgi.sources import (
    Source,
    client_ip,
    header,
    json_field,
    path_param,
    query_param,
    user,
)
from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.errors import ConfigurationError, SourceValueError
from ratelimit.rules.tree import RuleLike
from ratelimit.sync.limiter import RateLimit
from ratelimit.wsgi.environ import scope_of
from ratelimit.wsgi.middleware import DECISIONS, RateLimitMiddleware, Refused
from ratelimit.wsgi.response import as_text
from ratelimit.wsgi.views import ViewLimit, captured, no_application

__all__ = [
    "FlaskRateLimit",
    "Route",
    "Source",
    "client_ip",
    "header",
    "json_field",
    "path_param",
    "query_param",
    "refusal",
    "user",
]

F = TypeVar("F", bound=Callable[..., Any])
EXTENSION = "ratelimit"
"""The key of ``app.extensions`` holding the application's middleware."""


class FlaskRateLimit:
    """Rate limits for Flask applications, on ``limiter`` (a :class:`ratelimit.sync.RateLimit`).

    ``app``: the application, or none yet (call :meth:`init_app` from an application
    factory). The keywords are :class:`ratelimit.wsgi.RateLimitMiddleware`'s, checked here:
    ``routes`` (app-wide :class:`~ratelimit.asgi.Route` limits, matched on the path without
    ``SCRIPT_NAME``), ``exclude``, ``trusted_proxies``, ``forwarded_header``,
    ``ipv6_prefix`` (also what views' ``ip`` selectors read), ``headers``,
    ``legacy_headers`` and ``refused``.

    Example::

        limits = FlaskRateLimit(rl, app, routes=[Route("/ping", "ip:5/m")])

        @app.post("/login")
        @limits.limit("username:3/m", username=json_field("username"))
        def login(): ...
    """

    def __init__(
        self,
        limiter: RateLimit,
        app: flask.Flask | None = None,
        *,
        routes: Sequence[Route] = (),
        exclude: Iterable[str] = (),
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "x-forwarded-for",
        ipv6_prefix: int = 64,
        headers: bool = True,
        legacy_headers: bool = False,
        refused: Refused | None = None,
    ) -> None:
        self.options: dict[str, Any] = {
            "routes": tuple(routes),
            "exclude": tuple([exclude] if isinstance(exclude, str) else exclude),
            "trusted_proxies": tuple(
                [trusted_proxies] if isinstance(trusted_proxies, str) else trusted_proxies
            ),
            "forwarded_header": forwarded_header,
            "ipv6_prefix": ipv6_prefix,
            "headers": headers,
            "legacy_headers": legacy_headers,
            "refused": refused,
        }
        self.middleware = RateLimitMiddleware(
            no_application, limiter, templates=lambda environ: None, **self.options
        )  # checks them (init_app gives the application's templates)
        self.limiter = limiter
        self.proxies: TrustedProxies = self.middleware.proxies
        if app is not None:
            self.init_app(app)

    def init_app(self, app: flask.Flask) -> None:
        """Put the middleware in front of ``app`` (``app.wsgi_app``) and answer the
        ``RateLimitExceeded`` (429) and ``SourceValueError`` (422) of its views."""
        if not isinstance(app, flask.Flask):
            raise TypeError(f"init_app takes a flask.Flask application, not {app!r}")
        if EXTENSION in app.extensions:
            raise ConfigurationError(f"{app.name!r} has rate limits already (init_app twice)")
        middleware = RateLimitMiddleware(
            app.wsgi_app, self.limiter, templates=_templates_of(app), **self.options
        )
        app.wsgi_app = middleware  # type: ignore[method-assign]
        app.extensions[EXTENSION] = middleware
        own = app.error_handler_spec[None][None]  # yours, registered before, stay
        if RateLimitExceeded not in own:
            app.register_error_handler(RateLimitExceeded, refusal)
        if SourceValueError not in own:
            app.register_error_handler(SourceValueError, _unreadable)

    def limit(
        self,
        rules: RuleLike,
        *,
        key: str | None = None,
        cost: HTTPCost = 1,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: HTTPCountWhen | None = None,
        **sources: Any,
    ) -> Callable[[F], F]:
        """Limit a view, checked here. ``rules``, ``cost``, ``shadow``, ``penalty`` and
        ``count_when`` (flask-limiter's ``deduct_when``: ``count_when={401}`` counts failed
        logins only) as for :class:`~ratelimit.asgi.Route`; ``**sources``: where each
        selector's value comes
        from (``header``, ``query_param``, ``path_param`` for the view's URL variables,
        ``json_field`` for the JSON body, ``user``, or a function of the
        :class:`~ratelimit.asgi.HTTPRequest`; a selector named ``ip`` reads the client).
        ``key``: the counters' name, by default ``view``, the method and the URL rule
        (``"view POST /login"``; ``HEAD`` counts as ``GET``, whose view it runs; apart from
        a ``Route``'s ``"POST /login"``). Put it below
        ``@app.route``."""
        limit = ViewLimit(
            self.limiter, rules, key, cost, shadow, self.proxies, sources,
            f"FlaskRateLimit.limit({rules!r})", penalty, count_when,
        )  # fmt: skip

        def decorate(view: F) -> F:
            if inspect.iscoroutinefunction(view):
                raise TypeError(
                    f"FlaskRateLimit.limit: {view.__qualname__} is an async view, which Flask "
                    "runs on an event loop where the synchronous limiter cannot wait; limit "
                    "it with the app-wide routes (FlaskRateLimit(routes=[...]))"
                )

            @functools.wraps(view)
            def limited(*args: Any, **kwargs: Any) -> Any:
                request = flask.request
                if EXTENSION not in flask.current_app.extensions:
                    raise ConfigurationError(
                        f"{flask.current_app.name!r} has no FlaskRateLimit: give the "
                        "application to FlaskRateLimit(rl, app) or limits.init_app(app), "
                        "which answers refusals with 429"
                    )
                decision = flask.g.ratelimit = limit.decide(
                    request.environ,
                    _view_key(request, view),
                    request.view_args,
                    lambda: _json(request),
                )
                if not isinstance(request.environ.get(DECISIONS), list):  # an excluded path

                    @flask.after_this_request
                    def add_headers(response: Response) -> Response:
                        middleware = flask.current_app.extensions[EXTENSION]
                        for name, value in middleware.headers_for([decision]):
                            response.headers[name] = value
                        return response

                if count_when is None:
                    return view(*args, **kwargs)
                try:
                    response = flask.current_app.make_response(view(*args, **kwargs))
                except HTTPException as exc:  # abort(404): its status decides
                    limit.settled(request.environ, decision, exc.code or 500, [])
                    raise
                except Exception:  # a server error, whatever answers it
                    limit.settled(request.environ, decision, 500, [])
                    raise
                limit.settled(
                    request.environ, decision, response.status_code, response.headers.items()
                )
                return response

            setattr(limited, VIEW_LIMITED, True)  # per_route routes leave it alone
            return limited  # type: ignore[return-value]

        return decorate


def _templates_of(app: flask.Flask) -> Callable[[dict[str, Any]], str | None]:
    """The URL rule a request reaches in ``app`` (``/items/<int:item>``), for a
    ``per_route`` route; ``None`` where none does (404, 405, a redirect to add a slash);
    ``LIMITED_VIEW`` for a view of :meth:`FlaskRateLimit.limit` (its own limit decides)."""

    def template(environ: dict[str, Any]) -> str | None:
        try:
            rule, _ = app.url_map.bind_to_environ(environ).match(return_rule=True)
        except HTTPException:  # NotFound, MethodNotAllowed, RequestRedirect
            return None
        if getattr(app.view_functions.get(rule.endpoint), VIEW_LIMITED, False):
            return LIMITED_VIEW
        return str(rule.rule)

    return template


def _view_key(request: flask.Request, view: Callable[..., Any]) -> str:
    """``view``, the method (``HEAD`` as ``GET``) and the URL rule (``"view POST /login"``),
    else the view's qualified name."""
    method = "GET" if request.method == "HEAD" else request.method
    rule = request.url_rule
    if rule is not None:
        return view_key(method, rule.rule)
    return view_key(method, f"{view.__module__}.{view.__qualname__}")


def _json(request: flask.Request) -> Any:
    """The body as JSON whatever its content type (a view may read it with
    ``get_json(force=True)``), left for the view: cached, and its stream readable again."""
    data = request.get_data(cache=True)
    request.stream = io.BytesIO(data)  # Werkzeug's cached_property takes a value
    try:
        return flask.current_app.json.loads(data)
    except RecursionError:  # nested deeper than the parser goes: no value, not a 500
        return None


def refusal(exc: RateLimitExceeded) -> Response:
    """The answer to ``exc`` in a request of an application with :class:`FlaskRateLimit`:
    the middleware's 429 (503 when the store failed under ``on_error="deny"``), or its
    ``refused=``. The application's handler for ``RateLimitExceeded``; call it from a
    handler of your own that Flask asks first (a blueprint's ``errorhandler(Exception)``)."""
    environ = flask.request.environ
    middleware = flask.current_app.extensions[EXTENSION]
    decisions = environ.get(DECISIONS)
    own: list[Decision] = []  # the decisions whose headers this answer carries itself
    if not isinstance(decisions, list):  # an excluded path: the middleware adds none
        own.append(exc.decision)
    elif all(d is not exc.decision for d in decisions):
        decisions.append(exc.decision)  # the middleware adds the headers of them all
    request = HTTPRequest(scope_of(environ), middleware.proxies)
    full = getattr(exc, "limit", None)  # a concurrency limit's full slots
    status, headers, body = captured(
        lambda env, start: middleware.refuse(env, start, request, exc.decision, own, full),
        environ,
    )
    return Response(body, status, headers)


def _unreadable(exc: SourceValueError) -> Response:
    status, body = unreadable(exc)
    return Response(body, status, as_text(problem_headers(body)))
