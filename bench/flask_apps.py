"""The Flask application ``bench/wsgi.py`` serves under gunicorn, once per contender:
``GET /ping`` (a tiny JSON) limited to 1000 a minute per ``X-API-Key`` (the load spreads
over 1000 keys, so nothing is refused), counters in the Redis at ``BENCH_REDIS``, and an
unlimited ``GET /health`` (gunicorn's readiness probe). ``BENCH_APP`` picks the limiter:

- ``none``: no limiter (the ceiling);
- ``ratelimit``: ours, ``FlaskRateLimit`` with an app-wide ``Route`` (sliding log, the
  default; ``RateLimit`` headers);
- ``ratelimit-view``: ours, the view decorator ``@limits.limit(...)`` (headers too);
- ``ratelimit-fixed``: ours, the app-wide route on a fixed window;
- ``flask-limiter-moving``: flask-limiter's ``@limiter.limit`` on ``limits``' Redis storage,
  moving window (the equivalent of our sliding log), its ``X-RateLimit-*`` headers on;
- ``flask-limiter-fixed``: the same on a fixed window;
- ``flask-limiter-moving-bare``: moving window with its headers off (flask-limiter reads the
  window again for its headers, a second Redis call per request; ours answers both from one).
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Callable

from flask import Flask, request

from ratelimit.flask import FlaskRateLimit, Route, header
from ratelimit.sync import RateLimit

REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
RULE = "apikey:1000/m"
PREFIX = f"bench-wsgi-{uuid.uuid4().hex[:8]}"


def plain() -> Flask:
    app = Flask(__name__)

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"ping": "pong"}

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def ours(algorithm: str = "sliding-log", view: bool = False) -> Flask:
    rl = RateLimit.from_url(REDIS, namespace=PREFIX, algorithm=algorithm)
    app = Flask(__name__)
    routes = [] if view else [Route("/ping", RULE, methods=["GET"], apikey=header("X-API-Key"))]
    limits = FlaskRateLimit(rl, app, routes=routes, exclude=["/health"])

    def ping() -> dict[str, str]:
        return {"ping": "pong"}

    if view:
        ping = limits.limit(RULE, apikey=header("X-API-Key"))(ping)
    app.get("/ping")(ping)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def flask_limiter(strategy: str, headers: bool = True) -> Flask:
    from flask_limiter import Limiter

    app = Flask(__name__)
    limiter = Limiter(
        lambda: request.headers["X-API-Key"],
        app=app,
        storage_uri=REDIS,
        strategy=strategy,
        key_prefix=PREFIX,
        headers_enabled=headers,
    )

    @app.get("/ping")
    @limiter.limit("1000/minute")
    def ping() -> dict[str, str]:
        return {"ping": "pong"}

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def create_app() -> Flask:
    """The application ``BENCH_APP`` names; with ``BENCH_GC_FREEZE`` set, everything built so
    far is moved out of the garbage collector's sight (``gc.freeze()``)."""
    which = os.environ.get("BENCH_APP", "none")
    factories: dict[str, Callable[[], Flask]] = {
        "none": plain,
        "ratelimit": ours,
        "ratelimit-view": lambda: ours(view=True),
        "ratelimit-fixed": lambda: ours("fixed-window"),
        "flask-limiter-moving": lambda: flask_limiter("moving-window"),
        "flask-limiter-fixed": lambda: flask_limiter("fixed-window"),
        "flask-limiter-moving-bare": lambda: flask_limiter("moving-window", headers=False),
    }
    built = factories[which]()
    if os.environ.get("BENCH_GC_FREEZE"):
        gc.collect()
        gc.freeze()
    return built


app = create_app()  # gunicorn bench.flask_apps:app (imported in the worker, after the fork)
