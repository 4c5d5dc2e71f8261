"""A Django project in one module, for tests/test_django.py (Django's test client) and the
gunicorn tests (``gunicorn tests.django_project:application``): settings made here from the
environment, URLs and views.

``RATELIMIT_TEST_URL``: the storage (default ``memory://``); ``RATELIMIT_TEST_ON_ERROR``:
the failure policy; ``RATELIMIT_TEST_PROXIES``: trusted proxies, comma-separated;
``RATELIMIT_TEST_NAMESPACE``."""

from __future__ import annotations

import json
import os

import django
from django.conf import settings

from ratelimit.django import Route, header, json_field, path_param, user
from ratelimit.sync import RateLimit

_proxies = [p for p in os.environ.get("RATELIMIT_TEST_PROXIES", "").split(",") if p]
rl = RateLimit.from_url(
    os.environ.get("RATELIMIT_TEST_URL", "memory://"),
    namespace=os.environ.get("RATELIMIT_TEST_NAMESPACE", "django-tests"),
    on_error=os.environ.get("RATELIMIT_TEST_ON_ERROR", "allow"),
)
RATELIMIT = {
    "limiter": rl,
    "routes": [
        Route("/ping", "ip:5/m", methods=["GET"]),
        Route("/keyed", "apikey:5/m", apikey=header("X-API-Key")),
        Route("/ip", "ip:2/m", key="route-ip"),
        Route("/tokens", "apikey:100 tokens/m", apikey=header("X-API-Key"), settle="x-tokens"),
    ],
    "exclude": ["/health"],
    "trusted_proxies": _proxies,
}
if not settings.configured:
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        SECRET_KEY="tests-only",
        MIDDLEWARE=[
            "ratelimit.django.RateLimitMiddleware",
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
        RATELIMIT=RATELIMIT,
    )
    django.setup()

from django.contrib.auth.models import AnonymousUser  # noqa: E402  (after settings)
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from ratelimit.django import limit  # noqa: E402


class Member:
    """An authenticated user without a database."""

    is_authenticated = True

    def __init__(self, username: str) -> None:
        self.username = username


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("pong")


def tokens(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", headers={"X-Tokens": request.GET.get("used", "1")})


@limit("username:3/m", username=json_field("username"))
def login(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    return JsonResponse({"welcome": body["username"], "left": request.ratelimit.remaining})


@limit("item:2/m", item=path_param("item"))
def item(request: HttpRequest, item: int) -> HttpResponse:
    return HttpResponse(request.ratelimit.key)


@limit("account:1/m", account=json_field("account", type=int))
def pay(request: HttpRequest) -> HttpResponse:
    return HttpResponse("paid")


def as_member(view):  # type: ignore[no-untyped-def]
    """Sets ``request.user`` from the ``X-Member`` header (a test's stand-in for a login)."""

    def wrapped(request: HttpRequest) -> HttpResponse:
        name = request.headers.get("X-Member")
        request.user = Member(name) if name else AnonymousUser()
        return view(request)

    return wrapped


@as_member
@limit("member:1/m", member=user("username"))
def me(request: HttpRequest) -> HttpResponse:
    return HttpResponse("me")


@limit("ip:2/m", key="behind-proxies")
def ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ip")


@rl.limit("2/m", key="export")
def export(request: HttpRequest) -> HttpResponse:
    return HttpResponse("data")


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("ping", ping),
    path("keyed", ping),
    path("tokens", tokens),
    path("login", login),
    path("items/<int:item>", item),
    path("pay", pay),
    path("me", me),
    path("ip", ip),
    path("export", export),
    path("health", health),
]
application = get_wsgi_application()
