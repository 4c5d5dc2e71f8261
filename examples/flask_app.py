"""A Flask application limited per client IP, per username from the JSON body and per API
key: the four routes of ``examples/web_app.py``, in threaded code.

Serve it (Redis when REDIS_URL is set, else the in-process memory:// store)::

    gunicorn --threads 8 examples.flask_app:app

Then ``curl -i localhost:8000/ping`` six times: the sixth answers 429 with ``Retry-After``,
and every answer carries ``RateLimit-Policy`` and ``RateLimit`` headers. Or run
``python examples/flask_app.py``, which sends those requests to the app through Flask's
test client and prints the answers.

- ``GET /ping``: 5 a minute per client IP (an app-wide route).
- ``POST /login`` with ``{"username": "..."}``: 3 a minute per username (the view's limit).
- ``GET /search`` with an ``X-API-Key`` header: 10 a minute per key (an app-wide route).
- ``GET /health``: never limited.

No proxy is trusted: the client is ``REMOTE_ADDR``, whatever ``X-Forwarded-For`` says.
Behind a proxy, pass ``trusted_proxies=["10.0.0.0/8"]`` (its addresses).
"""

from __future__ import annotations

import os
import uuid

from flask import Flask, g, request

from ratelimit.flask import FlaskRateLimit, Route, header, json_field
from ratelimit.sync import RateLimit

rl = RateLimit.from_url(os.environ.get("REDIS_URL", "memory://"), namespace="flask-example")
app = Flask(__name__)
limits = FlaskRateLimit(
    rl,
    app,
    routes=[
        Route("/ping", "ip:5/m", methods=["GET"]),
        Route("/search", "apikey:10/m", methods=["GET"], apikey=header("X-API-Key")),
    ],
    exclude=["/health"],
)


@app.get("/ping")
def ping() -> dict[str, str]:
    return {"ping": "pong"}


@app.post("/login")
@limits.limit("username:3/m", username=json_field("username"))
def login() -> dict[str, object]:
    body = request.get_json(silent=True) or {}
    return {
        "welcome": body.get("username"),
        "attempts_left": g.ratelimit.remaining,
    }


@app.get("/search")
def search() -> dict[str, object]:
    return {"q": request.args.get("q", ""), "results": []}


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


def main() -> None:
    """Send the app the requests a curious client would, in process, and print the answers."""
    # A client address and names of this run's own, so that runs within a minute of each
    # other on one Redis don't meet each other's counts.
    run = uuid.uuid4().int
    address = f"10.{run % 250}.{run // 250 % 250}.{run // 62500 % 250}"
    ann, key = f"ann-{run % 10**6}", f"k-{run % 10**6}"
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    for n in range(1, 7):
        answer = client.get("/ping")
        print(f"GET /ping #{n}: {answer.status_code}  RateLimit: {answer.headers['RateLimit']}")
    print(f"  Retry-After: {answer.headers['Retry-After']}  body: {answer.text}")
    for n in range(1, 5):
        answer = client.post("/login", json={"username": ann})
        print(f"POST /login ann #{n}: {answer.status_code}  {answer.text.strip()[:70]}")
    answer = client.get("/search", headers={"X-API-Key": key})
    print(f"GET /search: {answer.status_code}  RateLimit: {answer.headers['RateLimit']}")
    answer = client.get("/health")
    print(f"GET /health: {answer.status_code}, headers: {sorted(answer.headers.keys())}")
    rl.close()


if __name__ == "__main__":
    main()
