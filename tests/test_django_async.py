"""Async Django views under the ``limit`` decorator: function views, class-based views
decorated with ``method_decorator(limit(...), name="dispatch")`` (or on ``get``) and the
view ``as_view()`` returns, through Django's WSGI test client (where Django runs an async
view in a loop of its own) and its ASGI one; with URL patterns of this module."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from ratelimit import Decision, MemoryBackend
from ratelimit.core.plan import Plan
from ratelimit.django import header, limit
from ratelimit.sync import RateLimit as SyncRateLimit
from tests import django_project  # configures Django first  # noqa: F401
from tests.test_django import client
from tests.test_wsgi import sf_list

pytestmark = pytest.mark.timeout(30)
by_caller = limit("caller:2/m", caller=header("X-Caller"))


class AsyncHello(View):  # type: ignore[misc]  # Django has no types here
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(f"left {request.ratelimit.remaining}")


@method_decorator(by_caller, name="dispatch")
class OnDispatch(AsyncHello):
    pass


@method_decorator(by_caller, name="get")
class OnGet(AsyncHello):
    pass


class SyncHello(View):  # type: ignore[misc]
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(f"left {request.ratelimit.remaining}")


@method_decorator(by_caller, name="dispatch")
class SyncOnDispatch(SyncHello):
    pass


@by_caller
async def function(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"left {request.ratelimit.remaining}")


class Urls:
    """A URLconf of this module's views (``ROOT_URLCONF`` takes an object)."""

    urlpatterns: ClassVar[list[Any]] = [
        path("dispatch", OnDispatch.as_view()),
        path("on-get", OnGet.as_view()),
        path("as-view", by_caller(AsyncHello.as_view())),
        path("function", function),
        path("sync-dispatch", SyncOnDispatch.as_view()),
    ]


PATHS = pytest.mark.parametrize(
    "where", ["/dispatch", "/on-get", "/as-view", "/function", "/sync-dispatch"]
)


def caller() -> dict[str, str]:
    return {"X-Caller": uuid.uuid4().hex}


def check(answers: list[Any]) -> None:
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.content for a in answers[:2]] == [b"left 1", b"left 0"]
    assert sf_list(answers[0]["RateLimit"]) == {"caller:2/m": {"r": 1, "t": 60}}
    assert answers[2]["Retry-After"] == "60"
    assert answers[2]["Content-Type"] == "application/problem+json"


@PATHS
@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "alone"])
def test_async_views_are_limited_under_wsgi(where: str, middleware: bool) -> None:
    chosen: dict[str, Any] = {} if middleware else {"MIDDLEWARE": []}
    with override_settings(ROOT_URLCONF=Urls, **chosen):
        http, who = client(), caller()
        check([http.get(where, headers=who) for _ in "abc"])


@PATHS
@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "alone"])
async def test_async_views_are_limited_under_asgi(where: str, middleware: bool) -> None:
    chosen: dict[str, Any] = {} if middleware else {"MIDDLEWARE": []}
    with override_settings(ROOT_URLCONF=Urls, **chosen):
        http, who = AsyncClient(), caller()
        check([await http.get(where, headers=who) for _ in "abc"])


def test_the_decorated_views_stay_what_they_were() -> None:
    marked: Callable[..., Any] = Urls.urlpatterns[2].callback
    assert iscoroutinefunction(marked)
    assert iscoroutinefunction(function)
    assert function.__name__ == "function"


class Meeting(MemoryBackend):
    """A store whose decisions wait (up to 10 s) until two are under way at once."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0
        self.met: asyncio.Event | None = None

    async def decide(self, plan: Plan) -> Decision:
        self.met = self.met or asyncio.Event()
        self.entered += 1
        if self.entered >= 2:
            self.met.set()
        await asyncio.wait_for(self.met.wait(), 10)
        return await super().decide(plan)


meeting = SyncRateLimit(Meeting())


@limit("caller:5/m", caller=header("X-Caller"), limiter=meeting)
async def met(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"degraded" if request.ratelimit.degraded else b"decided")


class MeetingUrls:
    urlpatterns: ClassVar[list[Any]] = [path("met", met)]


async def test_decisions_of_concurrent_async_requests_do_not_queue_behind_each_other() -> None:
    """Decisions of async views ran one at a time in Django's one sync thread: a store
    that answers two calls together (here: only once both are under way) was answered
    degraded after its 10 s. Only a limit reading ``request.user`` needs that thread."""
    with override_settings(ROOT_URLCONF=MeetingUrls, MIDDLEWARE=[]):
        http = AsyncClient()
        answers = await asyncio.gather(*(http.get("/met", headers=caller()) for _ in range(2)))
    assert [a.content for a in answers] == [b"decided", b"decided"]
