"""The service's plain HTTP/1.1 listeners, as small as what they serve: envoyproxy/
ratelimit's ``/json`` and ``/healthcheck`` (``PORT``) and its debug listener's ``/rlconfig``
(``DEBUG_PORT``).

Each route is an async function of the method and body that returns the status, content
type and body; connections are kept open between requests unless the client says
``Connection: close``. A request without ``Content-Length`` has no body (chunked bodies are
refused ``411``); a body over :data:`MAX_BODY` is refused ``413``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus

Reply = tuple[int, str, bytes]
Route = Callable[[str, bytes], Awaitable[Reply]]
MAX_BODY = 1 << 20
MAX_HEAD = 64 * 1024
logger = logging.getLogger("ratelimit.service")


def text(status: int, body: str | None = None) -> Reply:
    """A ``text/plain`` reply; by default the status's phrase and a newline, as Go's
    ``http.Error`` writes it."""
    said = f"{HTTPStatus(status).phrase}\n" if body is None else body
    return status, "text/plain; charset=utf-8", said.encode()


async def serve_http(host: str, port: int, routes: Mapping[str, Route]) -> asyncio.Server:
    """Listen on ``host:port`` (port 0: any free one) and answer ``routes`` by path."""

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await _one(reader, writer, routes):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(connected, host, port, limit=MAX_HEAD)


async def _one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: Mapping[str, Route]
) -> bool:
    """Answer one request; whether the connection stays open for another."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        await _write(writer, text(400), False)
        return False
    method, target, version = parts
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        await _write(writer, text(411), False)
        return False
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        await _write(writer, text(400), False)
        return False
    length = int(length_text)
    if length > MAX_BODY:
        await _write(writer, text(413), False)
        return False
    body = await reader.readexactly(length) if length else b""
    route = routes.get(target.split("?", 1)[0])
    if route is None:
        reply = text(404, "404 page not found\n")
    else:
        try:
            reply = await route(method, body)
        except Exception:  # one request's failure is its own: logged, answered 500
            logger.exception("ratelimit: %s %s failed", method, target)
            reply = text(500)
    await _write(writer, reply, keep)
    return keep


async def _write(writer: asyncio.StreamWriter, reply: Reply, keep: bool) -> None:
    status, content_type, body = reply
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
