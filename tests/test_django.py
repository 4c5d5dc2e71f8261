"""The Django middleware and view decorator (``ratelimit.django``), through Django's test
client on the project of tests/django_project.py (memory storage): routes from
``settings.RATELIMIT``, view limits reading the request's values, refusals answered as 429
(never Django's 500), settings checked when read."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings

from ratelimit import MemoryBackend
from ratelimit import RateLimit as AsyncRateLimit
from ratelimit.core.decision import Decision
from ratelimit.django import Config, Route, limit
from ratelimit.sync import RateLimit as SyncRateLimit
from tests import django_project  # configures Django first
from tests.test_wsgi import sf_list

pytestmark = pytest.mark.timeout(30)


def client() -> Client:
    """A client from an address of its own (counters are shared by the tests)."""
    run = uuid.uuid4().int
    return Client(REMOTE_ADDR=f"10.{run % 250}.{run // 250 % 250}.{run // 62500 % 250}")


def name() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


def test_a_route_refuses_the_sixth_with_headers_and_problem() -> None:
    http = client()
    answers = [http.get("/ping") for _ in range(6)]
    health = http.get("/health")
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert sf_list(answers[0]["RateLimit-Policy"]) == {"ip:5/m": {"q": 5, "w": 60}}
    assert sf_list(answers[0]["RateLimit"]) == {"ip:5/m": {"r": 4, "t": 60}}
    refused = answers[5]
    assert refused["Content-Type"] == "application/problem+json"
    assert refused["Retry-After"] == "60"
    assert refused.json()["violated-policies"] == ["ip:5/m"]
    assert health.status_code == 200
    assert not health.has_header("RateLimit")


def test_a_view_limit_reads_the_json_body() -> None:
    http, ann = client(), name()
    answers = [
        http.post("/login", {"username": ann}, content_type="application/json") for _ in range(4)
    ]
    other = http.post("/login", {"username": name()}, content_type="application/json")
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.json()["left"] for a in answers[:3]] == [2, 1, 0]
    assert answers[3].json()["detail"].startswith("rate limit exceeded (username:3/m)")
    assert sf_list(answers[3]["RateLimit"]) == {"username:3/m": {"r": 0, "t": 60}}
    assert answers[3]["Retry-After"] == "60"
    assert other.status_code == 200


def test_path_arguments_the_url_pattern_as_key_and_head_as_get() -> None:
    http = client()
    item = uuid.uuid4().int % 10**9
    first = http.get(f"/items/{item}")
    head = http.head(f"/items/{item}")
    third = http.get(f"/items/{item}")
    assert first.content == b"view ANY /items/<int:item>"  # one key for every method
    assert [first.status_code, head.status_code, third.status_code] == [200, 200, 429]
    assert http.get(f"/items/{item + 1}").status_code == 200


def test_unreadable_values_are_422_and_counted_nowhere() -> None:
    http, account = client(), uuid.uuid4().int % 10**9
    junk = http.post("/pay", {"account": "x"}, content_type="application/json")
    paid = [
        http.post("/pay", {"account": a}, content_type="application/json").status_code
        for a in (account, str(account))
    ]
    assert junk.status_code == 422
    assert junk["Content-Type"] == "application/problem+json"
    assert paid == [200, 429]


def test_the_authenticated_user_is_a_value() -> None:
    http, ann = client(), name()
    members = [http.get("/me", headers={"X-Member": ann}).status_code for _ in "ab"]
    anonymous = [http.get("/me").status_code for _ in "abc"]
    assert members == [200, 429]
    assert anonymous == [200] * 3  # no user: the rule does not apply


def test_a_refusal_raised_inside_a_view_is_a_429_not_a_500() -> None:
    # the export view is a @rl.limit function of the sync API: 2 a minute, for everyone
    http = client()
    answers = [http.get("/export") for _ in range(3)]
    assert [a.status_code for a in answers][-1] == 429
    assert answers[-1]["Retry-After"] == "60"
    assert sf_list(answers[-1]["RateLimit"]) == {"2/m": {"r": 0, "t": 60}}


def test_a_route_settles_from_the_response() -> None:
    http, key = client(), {"X-API-Key": name()}
    answers = [http.get("/tokens?used=60", headers=key).status_code for _ in range(3)]
    assert answers == [200, 200, 429]  # 60, then 120 tokens counted: no third


def test_forwarded_addresses_count_only_from_trusted_proxies() -> None:
    http = client()  # no proxy trusted in these settings
    answers = [
        http.get("/ip", headers={"X-Forwarded-For": f"198.51.100.{n}"}).status_code
        for n in range(3)
    ]
    assert answers == [200, 200, 429]  # all counted on REMOTE_ADDR


def test_without_the_middleware_a_view_still_answers_with_headers() -> None:
    with override_settings(MIDDLEWARE=[]):
        http, ann = client(), name()
        answers = [
            http.post("/login", {"username": ann}, content_type="application/json")
            for _ in range(4)
        ]
        unrouted = http.get("/ping")
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert sf_list(answers[0]["RateLimit"]) == {"username:3/m": {"r": 2, "t": 60}}
    assert answers[3]["Retry-After"] == "60"
    assert sf_list(answers[3]["RateLimit"]) == {"username:3/m": {"r": 0, "t": 60}}
    assert not unrouted.has_header("RateLimit")  # routes need the middleware


def test_a_refused_function_answers_and_a_failing_store_follows_the_policy() -> None:
    def refused(request: HttpRequest, decision: Decision) -> HttpResponse:
        return HttpResponse(f"slow down ({decision.rule})", status=429)

    own = {**django_project.RATELIMIT, "refused": refused}
    with override_settings(RATELIMIT=own):
        http = client()
        answers = [http.get("/ping") for _ in range(6)]
    assert answers[5].status_code == 429
    assert answers[5].content == b"slow down (ip:5/m)"
    assert answers[5]["Retry-After"] == "60"
    assert sf_list(answers[5]["RateLimit"]) == {"ip:5/m": {"r": 0, "t": 60}}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("nope", "must be a dict"),
        ({}, "needs 'limiter'"),
        ({"limiter": "memory://", "route": []}, "unknown key 'route'"),
        ({"limiter": "tests.django_project.nothing"}, "nothing"),
        ({"limiter": "tests.django_project.RATELIMIT"}, "must be a ratelimit.sync.RateLimit"),
        ({"limiter": "memory://", "exclude": ["health"]}, "starts with '/'"),
        ({"limiter": "memory://", "routes": [Route("/x", "2/m", cost=3)]}, "cost"),
        ({"limiter": "memory://", "refused": "no"}, "function of"),
    ],
)
def test_bad_settings_are_improperly_configured(given: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        Config(given)
    with override_settings(RATELIMIT=given), pytest.raises(ImproperlyConfigured, match=message):
        Client().get("/ping")  # the middleware reads them when Django builds it


def test_a_storage_url_gives_one_limiter_per_process() -> None:
    first, second = Config({"limiter": "memory://"}), Config({"limiter": "memory://"})
    assert first.limiter is second.limiter


def test_bad_view_limits_fail_when_made() -> None:
    with pytest.raises(TypeError, match=r"ratelimit\.sync\.RateLimit"):
        limit("2/m", limiter=AsyncRateLimit(MemoryBackend()))  # type: ignore[arg-type]
    with override_settings():
        del settings.RATELIMIT
        with pytest.raises(TypeError, match=r"limiter must be a ratelimit\.sync\.RateLimit"):
            limit("2/m", limiter=AsyncRateLimit(MemoryBackend()))  # type: ignore[arg-type]
        with pytest.raises(ImproperlyConfigured, match=r"needs settings\.RATELIMIT"):
            limit("2/m")  # the settings' limiter, which is not there


def test_a_view_limit_with_its_own_limiter_needs_no_settings() -> None:
    own = SyncRateLimit.from_url("memory://", namespace="own")

    def hello(request: HttpRequest) -> HttpResponse:
        return HttpResponse(f"left {request.ratelimit.remaining}")

    with override_settings(MIDDLEWARE=[]):
        del settings.RATELIMIT  # limiter= replaces it
        view = limit("2/m", limiter=own)(hello)
        answers = [view(RequestFactory().get("/hello")) for _ in "abc"]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].content == b"left 1"
    assert sf_list(answers[0]["RateLimit"]) == {"2/m": {"r": 1, "t": 60}}
    assert answers[2]["Retry-After"] == "60"
    assert answers[2]["Content-Type"] == "application/problem+json"
    own.close()
