"""A Flask shop limited by flask-limiter, as its users write it: the "before" of the
migration guide (docs/migrating.md shows this module's code from ``from flask`` on, and
tests/test_migrating.py checks that it still does). Ported in
tests/migrating_flask_after.py."""

from flask import Flask, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address


def api_key_or_ip() -> str:
    return request.headers.get("X-API-Key") or get_remote_address()


app = Flask(__name__)
limiter = Limiter(
    get_remote_address,
    app=app,
    default_limits=["10/minute"],
    storage_uri="memory://",
    headers_enabled=True,
)


@app.post("/login")
@limiter.limit("5/minute")
def login() -> dict[str, str]:
    return {"token": "t-1"}


@app.get("/api/items")
@limiter.limit("20/minute", key_func=api_key_or_ip)
def items() -> list[str]:
    return ["tea", "cups"]


@app.get("/search")
@limiter.limit("3/minute;20/hour")
def search() -> list[str]:
    return []


@app.get("/about")
def about() -> dict[str, str]:
    return {"shop": "teas"}


@app.get("/health")
@limiter.exempt
def health() -> dict[str, str]:
    return {"status": "ok"}
