"""Django: :class:`RateLimitMiddleware` (app-wide routes, headers and refusals, configured
in ``settings.RATELIMIT``) and the :func:`limit` view decorator with the request's values.

``settings.py``::

    MIDDLEWARE = [..., "ratelimit.django.RateLimitMiddleware"]
    RATELIMIT = {
        "limiter": "mysite.limits.rl",  # a ratelimit.sync.RateLimit, its dotted path, or a URL
        "routes": [Route("/ping", "ip:5/m", methods=["GET"])],
        "exclude": ["/health"],
    }

``views.py``::

    from ratelimit.django import json_field, limit

    @limit("username:3/m", username=json_field("username"))
    def login(request): ...

``RATELIMIT``'s other keys are :class:`ratelimit.wsgi.RateLimitMiddleware`'s arguments:
``trusted_proxies``, ``forwarded_header``, ``ipv6_prefix`` (what views' ``ip`` selectors
read too), ``headers``, ``legacy_headers``, and ``refused``: here a function of the Django
request and the decision returning the ``HttpResponse`` of a 429. A refused request never
reaches its view: it gets a 429 with ``Retry-After`` and problem details (503 when the
storage failed under ``on_error="deny"``); every response a limit decided carries
``RateLimit-Policy`` / ``RateLimit``. A ``RateLimitExceeded`` a view raises (a ``@rl.limit``
function of :mod:`ratelimit.sync`) is answered the same, not as a 500. Routes match
``request.path_info``, the path without ``SCRIPT_NAME``.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ratelimit.core.extras import needs_extra

with needs_extra("django"):
    from asgiref.sync import iscoroutinefunction, sync_to_async
    from django.conf import settings
    from django.conf.urls.i18n import is_language_prefix_patterns_used
    from django.core.exceptions import (
        BadRequest,
        ImproperlyConfigured,
        PermissionDenied,
        RequestDataTooBig,
        SuspiciousOperation,
    )
    from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
    from django.urls import Resolver404, resolve
    from django.utils.module_loading import import_string
    from django.utils.translation import get_language

from ratelimit.asgi.headers import problem_headers, retry_after, undecided, unreadable
from ratelimit.asgi.limits import HTTPCost, HTTPCountWhen, HTTPResponse
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
from ratelimit.core.slots import SlotLimit
from ratelimit.errors import SourceValueError
from ratelimit.rules.tree import RuleLike
from ratelimit.sync.limiter import RateLimit
from ratelimit.wsgi.environ import scope_of
from ratelimit.wsgi.middleware import DECISIONS, check_limiter
from ratelimit.wsgi.middleware import RateLimitMiddleware as WSGIMiddleware
from ratelimit.wsgi.response import as_text
from ratelimit.wsgi.views import ViewLimit, captured, no_application

__all__ = [
    "RateLimitMiddleware",
    "Route",
    "Source",
    "client_ip",
    "header",
    "json_field",
    "limit",
    "path_param",
    "query_param",
    "user",
]

F = TypeVar("F", bound=Callable[..., Any])
Refused = Callable[[HttpRequest, Decision], HttpResponseBase]
OPTIONS = frozenset(
    {
        "limiter",
        "routes",
        "exclude",
        "trusted_proxies",
        "forwarded_header",
        "ipv6_prefix",
        "headers",
        "legacy_headers",
        "refused",
    }
)


class Config:
    """``settings.RATELIMIT``, checked: the limiter, the WSGI middleware that holds the
    routes and answers refusals, and the ``refused`` function."""

    def __init__(self, given: object) -> None:
        if not isinstance(given, dict):
            raise ImproperlyConfigured(
                f"settings.RATELIMIT must be a dict with at least 'limiter', not {given!r}"
            )
        unknown = sorted(set(given) - OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"settings.RATELIMIT: unknown key {', '.join(map(repr, unknown))}; the keys "
                f"are {', '.join(sorted(OPTIONS))}"
            )
        if "limiter" not in given:
            raise ImproperlyConfigured(
                "settings.RATELIMIT needs 'limiter': a ratelimit.sync.RateLimit, its dotted "
                "path ('mysite.limits.rl'), or a storage URL ('redis://localhost:6379')"
            )
        options = dict(given)
        self.limiter = _limiter(options.pop("limiter"))
        refused = options.pop("refused", None)
        if refused is not None and not callable(refused):
            raise ImproperlyConfigured(
                f"settings.RATELIMIT['refused'] must be a function of (request, decision) "
                f"returning an HttpResponse, not {refused!r}"
            )
        self.refused: Refused | None = refused
        try:
            self.wsgi = WSGIMiddleware(
                no_application, self.limiter, templates=_url_pattern, **options
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"settings.RATELIMIT: {exc}") from exc

    def refusal(
        self, request: HttpRequest, decision: Decision, full: SlotLimit | None = None
    ) -> HttpResponseBase:
        """The answer to a refused request (without the rate-limit headers, which the
        caller adds): ``refused``'s, with ``Retry-After``, or problem details."""
        if self.refused is not None and not undecided(decision):
            response = self.refused(request, decision)
            wait = retry_after(decision)
            if not response.has_header("Retry-After") and wait is not None:
                response["Retry-After"] = str(wait)
            return response
        environ = request.META
        view = HTTPRequest(scope_of(environ), self.wsgi.proxies)
        status, headers, body = captured(
            lambda env, start: self.wsgi.refuse(env, start, view, decision, (), full), environ
        )
        return HttpResponse(body, status=status, headers=dict(headers))

    def add_headers(self, response: HttpResponseBase, decisions: Sequence[Decision]) -> None:
        """The rate-limit headers of ``decisions`` on ``response``."""
        for name, value in self.wsgi.headers_for(decisions):
            response[name] = value


_lock = threading.Lock()
_configs: dict[int, tuple[object, Config]] = {}  # the settings kept: no id is reused
_by_url: dict[str, RateLimit] = {}


def configured() -> Config:
    """``settings.RATELIMIT``, read and checked once per process (again if it is
    replaced, as ``override_settings`` does)."""
    given = getattr(settings, "RATELIMIT", None)
    if given is None:
        raise ImproperlyConfigured(
            "ratelimit.django needs settings.RATELIMIT = {'limiter': ...}: a "
            "ratelimit.sync.RateLimit, its dotted path, or a storage URL"
        )
    with _lock:
        found = _configs.get(id(given))
        if found is None:
            found = _configs[id(given)] = (given, Config(given))
        return found[1]


def _limiter(value: object) -> RateLimit:
    """The limiter ``settings.RATELIMIT['limiter']`` names."""
    if isinstance(value, str) and "://" in value:
        limiter = _by_url.get(value)
        if limiter is None:
            limiter = _by_url[value] = RateLimit.from_url(value)
        return limiter
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(f"settings.RATELIMIT['limiter']: {exc}") from exc
    if not isinstance(value, RateLimit):
        raise ImproperlyConfigured(
            f"settings.RATELIMIT['limiter'] must be a ratelimit.sync.RateLimit, its dotted "
            f"path or a storage URL, not {value!r}"
        )
    return value


class RateLimitMiddleware:
    """Django middleware: the routes of ``settings.RATELIMIT`` decided before the view,
    the rate-limit headers added to every response a limit decided (a route's or a view's),
    and a view's ``RateLimitExceeded`` answered as a 429. Put it first in ``MIDDLEWARE``
    (before anything that does work you would limit)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.config = configured()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        config = self.config
        gate = config.wsgi.gate(request.META)
        if gate is None:
            return self.get_response(request)
        if gate.unreadable is not None:
            return _unreadable(gate.unreadable)
        if gate.refused is not None:
            response = config.refusal(request, gate.refused)
        else:
            response = self.get_response(request)
            if gate.settle is not None:
                answer = HTTPResponse(
                    response.status_code, {k.lower(): v for k, v in response.items()}
                )
                limit, view, decision = gate.settle, gate.request, gate.decisions[0]
                config.limiter.run(lambda rl: limit.settled(rl, view, answer, decision))
        config.add_headers(response, gate.decisions)
        return response

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        """A view's ``RateLimitExceeded`` (429) or ``SourceValueError`` (422)."""
        if isinstance(exception, SourceValueError):
            return _unreadable(exception)
        if not isinstance(exception, RateLimitExceeded):
            return None
        decisions = request.META.get(DECISIONS)
        full = getattr(exception, "limit", None)  # a concurrency limit's full slots
        response = self.config.refusal(request, exception.decision, full)
        if not isinstance(decisions, list):  # an excluded path: __call__ adds no headers
            self.config.add_headers(response, [exception.decision])
        elif all(d is not exception.decision for d in decisions):
            decisions.append(exception.decision)
        return response


def _url_pattern(environ: dict[str, Any]) -> str | None:
    """The URL pattern a request reaches (``/items/<int:item>/``), for a ``per_route``
    route; ``None`` where none does; ``LIMITED_VIEW`` for a view of :func:`limit` (its own
    limit decides)."""
    try:
        match = resolve(environ.get("PATH_INFO", "") or "/")
    except Resolver404:
        return None
    if getattr(match.func, VIEW_LIMITED, False):
        return LIMITED_VIEW
    return f"/{match.route}"


def limit(
    rules: RuleLike,
    *,
    key: str | None = None,
    cost: HTTPCost = 1,
    shadow: bool | None = None,
    limiter: RateLimit | None = None,
    penalty: str | None = None,
    count_when: HTTPCountWhen | None = None,
    **sources: Any,
) -> Callable[[F], F]:
    """Limit a view, checked here. ``rules``, ``cost``, ``shadow``, ``penalty`` and
    ``count_when`` (``count_when={401}``: failed logins only) as for
    :class:`~ratelimit.asgi.Route`; ``**sources``: where each selector's value comes from
    (``header``, ``query_param``, ``path_param`` for the URL pattern's arguments,
    ``json_field`` for the JSON body, ``user`` for ``request.user``, or a function of the
    :class:`~ratelimit.asgi.HTTPRequest`; a selector named ``ip`` reads the client).
    ``key``: the counters' name, by default the URL pattern for every method (``"view ANY
    /login/"``: a function view runs for any method a client names; ``i18n_patterns``'
    language prefix left out). ``limiter``: by default ``settings.RATELIMIT``'s; given,
    ``settings.RATELIMIT`` is not needed (its other keys apply when set). The view reads
    its decision as ``request.ratelimit``. Without the middleware the view still answers
    429, with the headers. Async views (``async def``, an async class-based view's
    ``as_view()``, its ``dispatch`` or handler under ``method_decorator``) are decided in
    Django's synchronous thread (``sync_to_async``), where ``request.user`` may be read."""
    where = f"limit({rules!r})"
    config = _config_for(limiter, where)
    chosen = config.limiter if limiter is None else limiter
    proxies = config.wsgi.proxies
    view_limit = ViewLimit(
        chosen, rules, key, cost, shadow, proxies, sources, where, penalty, count_when
    )
    return _ViewDecorator(config, view_limit)


class _ViewDecorator:
    """What :func:`limit` puts around a view: the request's decision first, and the answer
    given in the view's place when it is refused."""

    def __init__(self, config: Config, view_limit: ViewLimit) -> None:
        self.config = config
        self.view_limit = view_limit

    def decided(
        self, request: HttpRequest, view: Callable[..., Any]
    ) -> Decision | HttpResponseBase:
        """The request's decision, or the answer given in the view's place."""
        match = request.resolver_match
        try:
            return self.view_limit.decide(
                request.META,
                _view_key(request, view),
                None if match is None else match.kwargs,
                lambda: _json(request),
                _user(request) if self.view_limit.needs_user else None,
            )
        except SourceValueError as exc:
            return _unreadable(exc)
        except RateLimitExceeded as exc:
            response = self.config.refusal(request, exc.decision)
            return self.answered(request, exc.decision, response)

    def answered(self, request: HttpRequest, decision: Decision, response: Any) -> Any:
        """``response``, with the decision's headers when no middleware adds them; the
        request refunded when ``count_when`` does not count it."""
        if self.view_limit.limit.count_when is not None and isinstance(response, HttpResponseBase):
            status, headers = response.status_code, list(response.items())
            self.view_limit.settled(request.META, decision, status, headers)
        alone = not isinstance(request.META.get(DECISIONS), list)
        if alone and isinstance(response, HttpResponseBase):
            self.config.add_headers(response, [decision])
        return response

    def raised(self, request: HttpRequest, decision: Decision, exc: Exception) -> None:
        """A view that raised, under ``count_when``: counted as the status Django answers
        it with (404, 403, 400; else 500)."""
        if self.view_limit.limit.count_when is None:
            return
        status = 500
        if isinstance(exc, Http404):
            status = 404
        elif isinstance(exc, PermissionDenied):
            status = 403
        elif isinstance(exc, SuspiciousOperation | BadRequest):
            status = 400
        self.view_limit.settled(request.META, decision, status, [])

    def __call__(self, view: F) -> F:
        decided, answered = self.decided, self.answered
        if _is_async(view):
            needs_user = self.view_limit.needs_user
            counts_when = self.view_limit.limit.count_when is not None

            async def limited_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                # Django's one sync thread only where request.user is read (the ORM's);
                # otherwise decisions of concurrent requests need not wait for each other.
                decide = sync_to_async(decided, thread_sensitive=needs_user)
                decision = await decide(request, view)
                if isinstance(decision, HttpResponseBase):
                    return decision
                request.ratelimit = decision
                try:
                    response = view(request, *args, **kwargs)
                    if inspect.isawaitable(response):
                        response = await response
                except Exception as exc:
                    if counts_when:  # what Django will answer it with decides
                        await sync_to_async(self.raised)(request, decision, exc)
                    raise
                if counts_when:  # its refund goes through the threaded limiter
                    return await sync_to_async(answered)(request, decision, response)
                return answered(request, decision, response)

            wrapped = functools.wraps(view)(limited_async)
            setattr(wrapped, VIEW_LIMITED, True)  # per_route routes leave it alone
            return wrapped  # type: ignore[return-value]

        @functools.wraps(view)
        def limited(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            decision = decided(request, view)
            if isinstance(decision, HttpResponseBase):
                return decision
            request.ratelimit = decision
            try:
                response = view(request, *args, **kwargs)
            except Exception as exc:
                self.raised(request, decision, exc)
                raise
            return answered(request, decision, response)

        setattr(limited, VIEW_LIMITED, True)
        return limited  # type: ignore[return-value]


def _config_for(limiter: object, where: str) -> Config:
    """``settings.RATELIMIT``'s configuration; for a view limit with its own ``limiter``
    and no ``settings.RATELIMIT``, the defaults (no trusted proxies, the headers on)."""
    if limiter is None or getattr(settings, "RATELIMIT", None) is not None:
        return configured()
    check_limiter(limiter, where)
    return Config({"limiter": limiter})


def _is_async(view: Callable[..., Any]) -> bool:
    """Whether Django awaits what ``view`` returns: an ``async def`` (a handler bound by
    ``method_decorator`` too), an async class-based view's ``as_view()`` (marked), or
    ``method_decorator``'s bound ``dispatch`` of one."""
    if iscoroutinefunction(view):
        return True
    bound = getattr(view, "func", None)  # method_decorator: a partial of the bound method
    return bool(getattr(getattr(bound, "__self__", None), "view_is_async", False))


def _view_key(request: HttpRequest, view: Callable[..., Any]) -> str:
    """``view ANY`` and the URL pattern (without ``i18n_patterns``' language prefix), else
    the view's name (``view`` as the other front ends' view limits have it). Never the
    method: a function view runs for any method a client names, and each name would be a
    counter of its own."""
    match = request.resolver_match
    route = None if match is None else match.route
    if route:
        return view_key("ANY", f"/{_without_language(request, route).lstrip('^')}")
    return view_key("ANY", f"{view.__module__}.{view.__qualname__}")


def _without_language(request: HttpRequest, route: str) -> str:
    """``route`` without the language prefix ``i18n_patterns`` put before it (``fr/``), so
    that every language's URL of one view counts on one key."""
    urlconf = getattr(request, "urlconf", settings.ROOT_URLCONF)
    if not is_language_prefix_patterns_used(urlconf)[0]:
        return route
    prefix = f"{get_language() or settings.LANGUAGE_CODE}/"
    return route[len(prefix) :] if route.startswith(prefix) else route


def _json(request: HttpRequest) -> Any:
    try:
        return json.loads(request.body)
    except RequestDataTooBig:
        if request.content_type == "multipart/form-data":
            return None  # an upload, which Django's parser streams: no JSON
        raise  # Django's 400: a view reading the stream (DRF) would read what we could not
    except Exception:  # not JSON, or a body the view already read as a stream: no value
        return None


def _user(request: HttpRequest) -> Any:
    """``request.user`` when authenticated, read in the request's thread (where Django's
    session and database connection are)."""
    who = getattr(request, "user", None)
    return who if who is not None and who.is_authenticated else None


def _unreadable(exc: SourceValueError) -> HttpResponse:
    status, body = unreadable(exc)
    return HttpResponse(body, status=status, headers=dict(as_text(problem_headers(body))))
