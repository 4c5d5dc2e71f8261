"""Every front end announces the keys it decides, so ``ratelimit override set`` can tell a
live key from a typo: the ASGI middleware, a Flask view and the rate-limit service's
handlers, on a real Redis, read back by the command line in another limiter. A key no
process decided is warned of, naming the nearest keys that were (``POST /v1/chat`` for a
route whose key is ``/v1/chat``)."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from ratelimit import RateLimit
from ratelimit.cli.command import main as cli

pytestmark = [pytest.mark.timeout(60), pytest.mark.redis]


def set_override(redis_url: str, namespace: str, key: str) -> int:
    """``ratelimit override set`` of ``key``: its exit code (its warning goes to stderr)."""
    return cli(
        ["override", "set", "--storage", redis_url, "--namespace", namespace, "--key", key,
         "apikey=k", "apikey:10/m"]
    )  # fmt: skip


async def test_routes_of_the_asgi_middleware_are_announced(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route as Endpoint

    from ratelimit.asgi import RateLimitMiddleware, Route, header

    namespace = f"keys-{uuid.uuid4().hex[:8]}"
    rl = RateLimit.from_url(redis_url, namespace)

    async def chat(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = RateLimitMiddleware(
        Starlette(routes=[Endpoint("/v1/chat", chat, methods=["POST"])]),
        rl,
        [Route("/v1/chat", "apikey:60/m", apikey=header("x-api-key"))],
    )
    try:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            answer = await http.post("/v1/chat", headers={"x-api-key": "k"})
            assert answer.status_code == 200
        await rl.overrides.refresh()  # what its task does within override_refresh
    finally:
        await rl.aclose()
    assert await asyncio.to_thread(set_override, redis_url, namespace, "/v1/chat") == 0
    assert "warning" not in capsys.readouterr().err
    await asyncio.to_thread(set_override, redis_url, namespace, "POST /v1/chat")
    err = capsys.readouterr().err
    assert "no process has decided a call of key 'POST /v1/chat'" in err
    assert "did you mean '/v1/chat'?" in err


def test_flask_views_are_announced(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    flask = pytest.importorskip("flask")
    import ratelimit.sync
    from ratelimit.flask import FlaskRateLimit

    namespace = f"keys-{uuid.uuid4().hex[:8]}"
    with ratelimit.sync.RateLimit.from_url(redis_url, namespace) as rl:
        app = flask.Flask("announced")
        limits = FlaskRateLimit(rl, app)

        @app.get("/report")  # type: ignore[untyped-decorator]
        @limits.limit("ip:3/m")
        def report() -> str:
            return "ok"

        assert app.test_client().get("/report").status_code == 200
        rl.portal.run(rl.limiter.overrides.refresh)
    assert set_override(redis_url, namespace, "view GET /report") == 0
    assert "warning" not in capsys.readouterr().err


async def test_the_service_announces_its_domains(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ratelimit.service import rules_file
    from ratelimit.service.handlers import Handlers, ratio_tree
    from ratelimit.service.proto.envoy import rls_pb2

    namespace = f"keys-{uuid.uuid4().hex[:8]}"
    rules = b'[[limit]]\ndomain = "gw"\ndescriptor = ["apikey"]\nrule = "5/m"\n'
    rl = RateLimit.from_url(redis_url, namespace)
    try:
        handlers = Handlers(rl, ratio_tree("100/m"), rules_file.parse(rules, "rules.toml"), 10.0)
        request = rls_pb2.RateLimitRequest(domain="gw")
        entry = request.descriptors.add().entries.add()
        entry.key, entry.value = "apikey", "k"
        await handlers.should_rate_limit(request)
        await rl.overrides.refresh()
    finally:
        await rl.aclose()
    assert await asyncio.to_thread(set_override, redis_url, namespace, "envoy/gw") == 0
    assert "warning" not in capsys.readouterr().err
