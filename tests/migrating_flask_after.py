"""tests/migrating_flask_before.py ported: the "after" of the migration guide
(docs/migrating.md shows this module's code from ``from flask`` on, and
tests/test_migrating.py checks that both limit alike)."""

from flask import Flask

from ratelimit.asgi import HTTPRequest, Route
from ratelimit.flask import FlaskRateLimit
from ratelimit.sync import RateLimit


def api_key_or_ip(request: HTTPRequest) -> str:
    return request.headers.get("X-API-Key") or request.client_ip


app = Flask(__name__)
rl = RateLimit.from_url("memory://")
limits = FlaskRateLimit(
    rl,
    app,
    routes=[Route("/*", "ip:10/minute", per_route=True)],  # default_limits
    exclude=["/health"],
    legacy_headers=True,
)


@app.post("/login")
@limits.limit("ip:5/minute")
def login() -> dict[str, str]:
    return {"token": "t-1"}


@app.get("/api/items")
@limits.limit("client:20/minute", client=api_key_or_ip)
def items() -> list[str]:
    return ["tea", "cups"]


@app.get("/search")
@limits.limit("ip:3/minute | ip:20/hour")
def search() -> list[str]:
    return []


@app.get("/about")
def about() -> dict[str, str]:
    return {"shop": "teas"}


@app.get("/health")  # excluded above: @limiter.exempt
def health() -> dict[str, str]:
    return {"status": "ok"}
