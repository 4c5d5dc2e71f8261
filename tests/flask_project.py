"""A Flask application for the gunicorn tests (``gunicorn tests.flask_project:app``),
configured from the environment as tests/django_project.py is: ``RATELIMIT_TEST_URL`` (the
storage), ``RATELIMIT_TEST_NAMESPACE``, ``RATELIMIT_TEST_ON_ERROR`` (the failure policy),
``RATELIMIT_TEST_PROXIES`` (trusted proxies, comma-separated)."""

from __future__ import annotations

import os

from flask import Flask, request

from ratelimit.flask import FlaskRateLimit, Route, header, json_field
from ratelimit.sync import RateLimit

rl = RateLimit.from_url(
    os.environ.get("RATELIMIT_TEST_URL", "memory://"),
    namespace=os.environ.get("RATELIMIT_TEST_NAMESPACE", "flask-tests"),
    on_error=os.environ.get("RATELIMIT_TEST_ON_ERROR", "allow"),
)
app = Flask(__name__)
limits = FlaskRateLimit(
    rl,
    app,
    routes=[
        Route("/ping", "ip:5/m", methods=["GET"]),
        Route("/keyed", "apikey:5/m", apikey=header("X-API-Key")),
    ],
    exclude=["/health"],
    trusted_proxies=[p for p in os.environ.get("RATELIMIT_TEST_PROXIES", "").split(",") if p],
)


@app.get("/ping")
def ping() -> str:
    return "pong"


@app.get("/keyed")
def keyed() -> str:
    return "keyed"


@app.post("/login")
@limits.limit("username:5/m", username=json_field("username"))
def login() -> dict[str, object]:
    return {"welcome": (request.get_json(silent=True) or {}).get("username")}


@app.get("/ip")
@limits.limit("ip:2/m")
def ip() -> str:
    return "ip"


@app.get("/health")
def health() -> str:
    return "ok"
