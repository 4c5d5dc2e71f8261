"""The service's plain HTTP/1.1 listeners, as small as what they serve: envoyproxy/
ratelimit's ``/json`` and ``/healthcheck`` (``PORT``) and its debug listener's ``/rlconfig``
(``DEBUG_PORT``).

Each route is an async function of the method and body that returns the status, content
type (empty: no ``Content-Type``) and body; any method reaches it, as gorilla/mux without a
method matcher lets any through. A connection behaves as Go's net/http server does wherever
a client could tell:

- requests are answered in order, pipelined ones too; the connection stays open unless the
  client says ``Connection: close`` or speaks HTTP/1.0 without ``Connection: keep-alive``;
  a ``HEAD`` request gets the headers alone; lines may end in a bare ``\\n``;
- the request target is a path or an absolute URI (``http://host/json``); its path is
  percent-decoded;
- a body comes by ``Content-Length`` or chunked (extensions and trailers dropped); on
  ``Expect: 100-continue`` it is asked for with ``100 Continue``, except on a path no route
  serves, which is answered ``404`` without reading it (and the connection closed); another
  expectation is refused ``417``;
- a head over :data:`MAX_HEAD` (net/http's ``DefaultMaxHeaderBytes``) is refused ``431``, a
  malformed request ``400``, an HTTP major version other than 1 ``505``, a transfer coding
  other than chunked ``501``; a body over :data:`MAX_BODY` is refused ``413`` (net/http has
  no such limit); the connection closes after each of these;
- every reply carries ``Date`` and ``Content-Length``; an error in ``text/plain`` carries
  ``X-Content-Type-Options: nosniff``, as ``http.Error`` writes it.

net/http's default server has no timeouts. Here a connection idle for :data:`TIMEOUT`
seconds (a minute) between requests is closed, and so is one whose request is still
arriving, or whose reply is still unread, :data:`TIMEOUT` seconds on: a stuck client holds
nothing for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from urllib.parse import unquote

Reply = tuple[int, str, bytes]
Route = Callable[[str, bytes], Awaitable[Reply]]
MAX_BODY = 1 << 20
MAX_HEAD = 1 << 20  # net/http's DefaultMaxHeaderBytes
MAX_CHUNK_LINE = 4096  # net/http's longest chunk-size line
MAX_TRAILER = 4096  # net/http reads trailers within its 4 KiB buffer
TIMEOUT = 60.0
LINGER = 0.5  # net/http's rstAvoidanceDelay: time for a client to read why it was closed
PLAIN = "text/plain; charset=utf-8"
logger = logging.getLogger("ratelimit.service")

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_NOT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_LENGTH = re.compile(r"[0-9]{1,19}")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


# net/http's StatusText for what this server answers. Go's phrases, not Python's: Python
# 3.13 renamed some (413 "Content Too Large"), and a client reading the status line should
# see what the Go service writes.
_GO_PHRASES = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    413: "Request Entity Too Large",
    417: "Expectation Failed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
}


def text(status: int, body: str | None = None) -> Reply:
    """A ``text/plain`` reply; by default the status's phrase and a newline, as Go's
    ``http.Error`` writes it."""
    said = f"{_phrase(status)}\n" if body is None else body
    return status, PLAIN, said.encode()


async def serve_http(host: str, port: int, routes: Mapping[str, Route]) -> asyncio.Server:
    """Listen on ``host:port`` (port 0: any free one) and answer ``routes`` by path."""

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _Connection(reader, writer, routes).serve()

    return await asyncio.start_server(connected, host, port, limit=MAX_HEAD)


class _Refusal(Exception):
    """A request answered ``reply`` before any route sees it; the connection then closes.
    Raised and caught within this module only."""

    def __init__(self, reply: Reply, minor: int = 1) -> None:
        super().__init__(reply[0])
        self.reply = reply
        self.minor = minor


def _unreadable(status: int, detail: str = "") -> _Refusal:
    """net/http's answer to a head it cannot read: ``400 Bad Request`` (``: detail``)."""
    said = f"{status} {_phrase(status)}" + (f": {detail}" if detail else "")
    return _Refusal((status, PLAIN, said.encode()))


def _phrase(status: int) -> str:
    return _GO_PHRASES.get(status, f"status code {status}")


def _tokens(values: Iterable[str]) -> set[str]:
    """The comma-separated tokens of a field's values, lower-cased."""
    return {token.strip().lower() for value in values for token in value.split(",")} - {""}


@dataclass(frozen=True, slots=True)
class _Head:
    """A request's line and fields: ``minor`` is the ``y`` of ``HTTP/1.y``; ``fields`` holds
    each field's values by lower-case name."""

    method: str
    path: str
    minor: int
    fields: dict[str, list[str]]

    @property
    def keep_alive(self) -> bool:
        said = _tokens(self.fields.get("connection", ()))
        return "close" not in said and (self.minor >= 1 or "keep-alive" in said)

    def length(self) -> int | None:
        """The body's length, ``None`` for a chunked one (net/http's ``readTransfer``: an
        HTTP/1.0 request's ``Transfer-Encoding`` is ignored; a chunked one's
        ``Content-Length`` too)."""
        codings = self.fields.get("transfer-encoding")
        if codings is not None and self.minor >= 1:
            if len(codings) != 1 or codings[0].lower() != "chunked":
                raise _Refusal((501, PLAIN, b"Unsupported transfer encoding"))
            return None
        lengths = self.fields.get("content-length")
        if not lengths:
            return 0
        first = lengths[0]
        if any(other != first for other in lengths) or not _LENGTH.fullmatch(first):
            raise _unreadable(400)
        if int(first) >= 1 << 63:
            raise _unreadable(400)
        return int(first)

    def expects_continue(self) -> bool:
        """Whether the client waits for ``100 Continue``; any other expectation is
        refused ``417``."""
        expectation = self.fields.get("expect", [""])[0]
        if "100-continue" in _tokens([expectation]):
            return True
        if expectation:
            raise _Refusal((417, "", b""), self.minor)
        return False


def _parse_head(lines: list[str]) -> _Head:
    method, _, rest = lines[0].partition(" ")
    target, space, version = rest.partition(" ")
    matched = _VERSION.fullmatch(version)
    if not space or matched is None or not _TOKEN.fullmatch(method):
        raise _unreadable(400)
    path = _path(target)
    if path is None:
        raise _unreadable(400)
    fields = _fields(lines[1:])
    if matched[1] != "1":
        raise _unreadable(505, "unsupported protocol version")
    return _Head(method, path, int(matched[2]), fields)


def _path(target: str) -> str | None:
    """The path of a request target (``/json?x``, ``http://host/json``), percent-decoded;
    ``None`` if net/url would not parse it."""
    path = target.partition("?")[0]
    if not path.startswith("/"):
        absolute = _ABSOLUTE.match(path)
        if absolute is None:
            return None
        path = path[absolute.end() :] or "/"
    if _BAD_ESCAPE.search(path) or _CONTROL.search(target):
        return None
    return unquote(path, encoding="latin-1")


def _fields(lines: list[str]) -> dict[str, list[str]]:
    """Header (or trailer) fields by lower-case name; a line starting with a space or tab
    continues the field before (obsolete folding, which net/textproto still reads)."""
    fields: dict[str, list[str]] = {}
    last: list[str] | None = None
    for line in lines:
        if line[0] in " \t":
            if last is None or _CONTROL_NOT_TAB.search(line):
                raise _unreadable(400)
            last[-1] = f"{last[-1]} {line.strip()}"
            continue
        name, colon, value = line.partition(":")
        value = value.strip(" \t")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL_NOT_TAB.search(value):
            raise _unreadable(400)
        last = fields.setdefault(name.lower(), [])
        last.append(value)
    return fields


class _Connection:
    """One client's connection: its requests answered in order until it closes."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        routes: Mapping[str, Route],
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.routes = routes
        self.after_post = False

    async def serve(self) -> None:
        try:
            # the client went away, or kept us waiting TIMEOUT: closed without a word
            with contextlib.suppress(ConnectionError, TimeoutError):
                try:
                    while await self._answer_one():
                        pass
                except _Refusal as refusal:
                    await self._write(refusal.reply, refusal.minor, keep=False)
        finally:
            await self._close()

    async def _answer_one(self) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        async with asyncio.timeout(TIMEOUT) as deadline:
            lines = await self._head_lines(deadline)
            if not lines:
                return False
            head = _parse_head(lines)
            self.after_post = head.method == "POST"
            length = head.length()
            continues = head.expects_continue()
            route = self.routes.get(head.path)
            # net/http's 404 handler reads no body: none is asked for, and one sent closes
            body = b"" if route is None else await self._body(head, length, continues)
        keep = head.keep_alive and (route is not None or length == 0)
        reply = await self._reply(route, head, body)
        await self._write(reply, head.minor, keep, head_only=head.method == "HEAD")
        return keep

    async def _head_lines(self, deadline: asyncio.Timeout) -> list[str]:
        """The request line and header lines of one request, their ends dropped; ``[]`` at
        the end of the stream between requests. Once the request line is in, the request
        has :data:`TIMEOUT` more seconds."""
        lines: list[str] = []
        size = 0
        while True:
            try:
                raw = await self.reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:  # net/http: io.ErrUnexpectedEOF
                if lines or exc.partial:
                    raise _unreadable(400) from None
                return []
            except asyncio.LimitOverrunError:
                raise _unreadable(431) from None
            size += len(raw)
            if size > MAX_HEAD:
                raise _unreadable(431)
            line = raw.removesuffix(b"\n").removesuffix(b"\r").decode("latin-1")
            if line and not lines:
                deadline.reschedule(asyncio.get_running_loop().time() + TIMEOUT)
            if line:
                lines.append(line)
            elif lines:
                return lines
            elif not self.after_post or size > 4:  # net/http skips 4 CR/LF after a POST
                raise _unreadable(400)

    async def _body(self, head: _Head, length: int | None, continues: bool) -> bytes:
        if length == 0:
            return b""
        if length is not None and length > MAX_BODY:
            raise _Refusal(text(413), head.minor)
        if continues and head.minor >= 1:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.writer.drain()
        try:
            if length is None:
                return await self._chunked(head.minor)
            return await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            raise _Refusal(text(400), head.minor) from None

    async def _chunked(self, minor: int) -> bytes:
        """A chunked body, read as net/http's chunkedReader reads it: each size line ends
        in CRLF and is under 4 KiB, its extensions dropped; overhead beyond 16 bytes a chunk
        plus twice its data may add up to 16 KiB; the trailer fields are read and dropped."""
        malformed = _Refusal(text(400), minor)
        body = bytearray()
        excess = 0
        while True:
            line = await self._chunk_line(malformed)
            excess += len(line) + 2
            size_text = line.partition(b";")[0].rstrip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size_text):
                raise malformed
            size = int(size_text, 16)
            excess = max(excess - 16 - 2 * size, 0)
            if excess > 16 * 1024:
                raise malformed
            if size == 0:
                break
            if len(body) + size > MAX_BODY:
                raise _Refusal(text(413), minor)
            body += await self.reader.readexactly(size)
            if await self.reader.readexactly(2) != b"\r\n":
                raise malformed
        trailer: list[str] = []
        size = 0
        while line := await self._chunk_line(malformed):
            size += len(line) + 2
            if size > MAX_TRAILER:
                raise malformed
            trailer.append(line.decode("latin-1"))
        try:
            _fields(trailer)
        except _Refusal:
            raise malformed from None
        return bytes(body)

    async def _chunk_line(self, malformed: _Refusal) -> bytes:
        """One line of chunked framing without its CRLF (a bare LF or a CR before the end
        is malformed, as net/http has it)."""
        raw = await self.reader.readuntil(b"\n")
        if len(raw) - 2 >= MAX_CHUNK_LINE or b"\r" in raw[:-2] or raw[-2:] != b"\r\n":
            raise malformed
        return raw[:-2]

    async def _reply(self, route: Route | None, head: _Head, body: bytes) -> Reply:
        if route is None:
            return text(404, "404 page not found\n")
        try:
            return await route(head.method, body)
        except Exception:  # one request's failure is its own: logged, answered 500
            logger.exception("ratelimit: %s %s failed", head.method, head.path)
            return text(500)

    async def _write(self, reply: Reply, minor: int, keep: bool, head_only: bool = False) -> None:
        """Send ``reply`` as net/http does to an HTTP/1.``minor`` request (within
        :data:`TIMEOUT`)."""
        status, content_type, body = reply
        lines = [f"HTTP/1.{min(minor, 1)} {status} {_phrase(status)}"]
        if content_type:
            lines.append(f"Content-Type: {content_type}")
        if status >= 400 and content_type == PLAIN:
            lines.append("X-Content-Type-Options: nosniff")
        lines += [f"Date: {formatdate(usegmt=True)}", f"Content-Length: {len(body)}"]
        if keep and minor == 0:
            lines.append("Connection: keep-alive")
        elif not keep and minor >= 1:
            lines.append("Connection: close")
        said = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.writer.write(said if head_only else said + body)
        async with asyncio.timeout(TIMEOUT):
            await self.writer.drain()

    async def _close(self) -> None:
        """Close as net/http's ``closeWriteAndWait`` does: end our side, then give the
        client :data:`LINGER` seconds to read the answer (what it still sends is dropped)
        before the socket closes, so that unread input does not reset the connection."""
        writer = self.writer
        try:
            with contextlib.suppress(OSError, TimeoutError):
                if writer.can_write_eof():
                    writer.write_eof()
                async with asyncio.timeout(LINGER):
                    while await self.reader.read(1 << 16):
                        pass
        finally:
            writer.close()
        try:
            async with asyncio.timeout(LINGER):
                await writer.wait_closed()
        except TimeoutError:  # a reply the client never reads
            writer.transport.abort()
        except OSError:
            pass
