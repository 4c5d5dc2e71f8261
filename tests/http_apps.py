"""Applications the HTTP tests serve under a real uvicorn (``--factory``), configured by
environment variables so that each test's server is its own:

- ``RL_TEST_STORAGE``: the storage URL (default ``memory://``);
- ``RL_TEST_TRUSTED``: trusted proxies, comma-separated (default none);
- ``RL_TEST_ON_ERROR``: the failure policy (default ``allow``).
"""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations, which
# name objects local to the factories below.
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route as StarletteRoute
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from ratelimit import Decision, RateLimit
from ratelimit.asgi import RateLimitMiddleware, Route, RouteLimit, header, json_field

RELEASE = asyncio.Event()


def limiter() -> RateLimit:
    return RateLimit.from_url(
        os.environ.get("RL_TEST_STORAGE", "memory://"),
        namespace=f"http-{os.getpid()}",
        on_error=os.environ.get("RL_TEST_ON_ERROR", "allow"),
        timeout=0.5,
        denial_cache=0,  # every request reaches the storage (a killed Redis shows at once)
    )


def middleware_options(rl: RateLimit) -> dict[str, Any]:
    trusted = [t for t in os.environ.get("RL_TEST_TRUSTED", "").split(",") if t]
    return {
        "limiter": rl,
        "routes": [
            Route("/ping", "ip:5/m", methods=["GET"]),
            Route("/tree", "ip:3/m | ip:10/h | 1000/d"),
            Route("/search", "apikey:10/m", apikey=header("X-API-Key")),
            Route("/shadow", "ip:1/m", shadow=True),
            Route("/stream", "ip:100/m"),
            Route("/ws", "ip:1/m", methods=["WEBSOCKET"]),
        ],
        "exclude": ["/health", "/release"],
        "trusted_proxies": trusted,
        "legacy_headers": True,
    }


async def _chunks() -> AsyncIterator[bytes]:
    yield b"first\n"
    await asyncio.wait_for(RELEASE.wait(), 30)
    RELEASE.clear()
    yield b"second\n"


def starlette_app() -> Starlette:
    rl = limiter()
    login_limit = RouteLimit(rl, "username:3/m", username=json_field("username"))
    socket_limit = RouteLimit(rl, "ip:1/m", key="inner socket")

    async def plain(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def login(request: Request) -> JSONResponse:
        decision = await login_limit.check(request)
        body = await request.json()
        return JSONResponse({"welcome": body["username"], "left": decision.remaining})

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(_chunks(), media_type="text/plain")

    async def release(request: Request) -> PlainTextResponse:
        RELEASE.set()
        return PlainTextResponse("released")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    async def limited_echo(websocket: WebSocket) -> None:
        await socket_limit.check(websocket)  # refused: the middleware refuses the handshake
        await echo(websocket)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await rl.aclose()

    app = Starlette(
        routes=[
            StarletteRoute(path, plain)
            for path in ("/ping", "/tree", "/search", "/shadow", "/health", "/other")
        ]
        + [
            StarletteRoute("/login", login, methods=["POST"]),
            StarletteRoute("/stream", stream),
            StarletteRoute("/release", release),
            WebSocketRoute("/ws", echo),
            WebSocketRoute("/ws-inner", limited_echo),
        ],
        lifespan=lifespan,
    )
    app.add_middleware(RateLimitMiddleware, **middleware_options(rl))
    return app


class Login(BaseModel):
    username: str


def fastapi_app() -> FastAPI:
    rl = limiter()
    login_limit = RouteLimit(rl, "username:3/m", username=json_field("username"))
    socket_limit = RouteLimit(rl, "ip:1/m", key="inner socket")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await rl.aclose()

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(RateLimitMiddleware, **middleware_options(rl))

    @app.get("/ping")
    @app.get("/tree")
    @app.get("/search")
    @app.get("/shadow")
    @app.get("/health")
    @app.get("/other")
    async def plain() -> str:
        return "ok"

    @app.post("/login")
    async def login(
        body: Login, decision: Annotated[Decision, Depends(login_limit)]
    ) -> dict[str, Any]:
        return {"welcome": body.username, "left": decision.remaining}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(_chunks(), media_type="text/plain")

    @app.get("/release")
    async def release() -> str:
        RELEASE.set()
        return "released"

    @app.websocket("/ws")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    @app.websocket("/ws-inner")
    async def limited_echo(websocket: WebSocket) -> None:
        await socket_limit.check(websocket)
        await echo(websocket)

    return app
