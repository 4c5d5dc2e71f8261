"""A Django application limited per client IP, per username from the JSON body and per API
key: the four routes of ``examples/web_app.py``, in one file with its settings inline.

Serve it (Redis when REDIS_URL is set, else the in-process memory:// store)::

    gunicorn --threads 8 examples.django_app:application

Then ``curl -i localhost:8000/ping`` six times: the sixth answers 429 with ``Retry-After``,
and every answer carries ``RateLimit-Policy`` and ``RateLimit`` headers. Or run
``python examples/django_app.py``, which sends those requests through Django's test client
and prints the answers.

- ``GET /ping``: 5 a minute per client IP (a route of ``settings.RATELIMIT``).
- ``POST /login`` with ``{"username": "..."}``: 3 a minute per username (the view's limit).
- ``GET /search`` with an ``X-API-Key`` header: 10 a minute per key (a route).
- ``GET /health``: never limited.

In a project, ``RATELIMIT`` and ``MIDDLEWARE`` go in ``settings.py`` (``"limiter"`` may be
the dotted path of a ``ratelimit.sync.RateLimit``, or a storage URL) and the views in
``views.py``. No proxy is trusted: the client is ``REMOTE_ADDR``.
"""

from __future__ import annotations

import json
import os
import uuid

import django
from django.conf import settings

from ratelimit.django import Route, header, json_field, limit

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    SECRET_KEY="only-for-this-example",
    MIDDLEWARE=["ratelimit.django.RateLimitMiddleware"],
    RATELIMIT={
        "limiter": os.environ.get("REDIS_URL", "memory://"),
        "routes": [
            Route("/ping", "ip:5/m", methods=["GET"]),
            Route("/search", "apikey:10/m", methods=["GET"], apikey=header("X-API-Key")),
        ],
        "exclude": ["/health"],
    },
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402  (after settings)
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.http import require_GET, require_POST  # noqa: E402


@require_GET
def ping(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ping": "pong"})


@require_POST
@limit("username:3/m", username=json_field("username"))
def login(request: HttpRequest) -> JsonResponse:
    decision = request.ratelimit
    body = json.loads(request.body)
    return JsonResponse({"welcome": body["username"], "attempts_left": decision.remaining})


@require_GET
def search(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"q": request.GET.get("q", ""), "results": []})


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("ping", ping),
    path("login", login),
    path("search", search),
    path("health", health),
]
application = get_wsgi_application()


def main() -> None:
    """Send the app the requests a curious client would, in process, and print the answers."""
    from django.test import Client

    # A client address and names of this run's own, so that runs within a minute of each
    # other on one Redis don't meet each other's counts.
    run = uuid.uuid4().int
    address = f"10.{run % 250}.{run // 250 % 250}.{run // 62500 % 250}"
    ann, key = f"ann-{run % 10**6}", f"k-{run % 10**6}"
    client = Client(REMOTE_ADDR=address)
    for n in range(1, 7):
        answer = client.get("/ping")
        print(f"GET /ping #{n}: {answer.status_code}  RateLimit: {answer['RateLimit']}")
    print(f"  Retry-After: {answer['Retry-After']}  body: {answer.content.decode()}")
    for n in range(1, 5):
        answer = client.post("/login", {"username": ann}, content_type="application/json")
        print(f"POST /login ann #{n}: {answer.status_code}  {answer.content.decode()[:70]}")
    answer = client.get("/search", headers={"X-API-Key": key})
    print(f"GET /search: {answer.status_code}  RateLimit: {answer['RateLimit']}")
    answer = client.get("/health")
    print(f"GET /health: {answer.status_code}, headers: {sorted(answer.headers)}")


if __name__ == "__main__":
    main()
