"""The envoy service's HTTP/1.1 listener (``serve_http``) against what Go's net/http does
for the same bytes: chunked bodies, ``Expect: 100-continue``, HTTP/1.0 keep-alive, ``HEAD``,
absolute request targets, pipelining, the head limit, malformed requests, timeouts, and the
``Date`` and ``nosniff`` headers. Real sockets on 127.0.0.1; every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx
import pytest

from ratelimit.service.envoy_service import http
from ratelimit.service.envoy_service.http import Reply, serve_http, text

pytestmark = pytest.mark.timeout(30)
PROMPT = 5.0  # seconds within which an answer due now must come: a deadline, never a sleep
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def echo(method: str, body: bytes) -> Reply:
    said = {"method": method, "body": body.decode("latin-1")}
    return 200, "application/json", json.dumps(said).encode()


async def healthcheck(method: str, body: bytes) -> Reply:
    return 200, "text/plain; charset=utf-8", b"OK"


async def unhealthy(method: str, body: bytes) -> Reply:
    return 500, "", b""


async def refused(method: str, body: bytes) -> Reply:
    return text(400)


async def broken(method: str, body: bytes) -> Reply:
    raise RuntimeError("a route that fails")


async def large(method: str, body: bytes) -> Reply:
    return 200, "application/octet-stream", bytes(32 << 20)  # more than socket buffers hold


ROUTES = {
    "/json": echo,
    "/healthcheck": healthcheck,
    "/unhealthy": unhealthy,
    "/refused": refused,
    "/broken": broken,
    "/large": large,
}


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = await serve_http("127.0.0.1", 0, ROUTES)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short :data:`http.TIMEOUT`, so the tests of timeouts finish fast."""
    monkeypatch.setattr(http, "TIMEOUT", 0.2)
    return 0.2


@dataclass
class Answer:
    status_line: str
    headers: dict[str, str]  # by lower-case name
    body: bytes

    @property
    def status(self) -> int:
        return int(self.status_line.split(" ")[1])


class Raw:
    """A client that sends bytes exactly as given and reads the answers as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes, *, end: bool = False) -> None:
        self.writer.write(data)
        if end:
            self.writer.write_eof()
        await self.writer.drain()

    async def exactly(self, size: int) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(size), PROMPT)

    async def answer(self, *, head_only: bool = False) -> Answer:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), PROMPT)
        status_line, *lines = head.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
        length = 0 if head_only else int(headers.get("content-length", "0"))
        return Answer(status_line, headers, await self.exactly(length))

    async def closed(self) -> bool:
        """Whether the server closes the connection (within :data:`PROMPT`) sending
        nothing more."""
        return await asyncio.wait_for(self.reader.read(), PROMPT) == b""


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[Raw]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield Raw(reader, writer)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def one(port: int, request: bytes, *, end: bool = False) -> Answer:
    """Send ``request``, read one answer; the server then closes the connection."""
    async with connected(port) as raw:
        await raw.send(request, end=end)
        answer = await raw.answer()
        assert await raw.closed()
    return answer


def get(path: str = "/healthcheck", *more: str, version: str = "HTTP/1.1") -> bytes:
    lines = [f"GET {path} {version}", "Host: ratelimit", *more, "", ""]
    return "\r\n".join(lines).encode("latin-1")


# 1. chunked bodies


async def test_a_chunked_body_is_decoded_with_extensions_and_trailers(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(
            b"POST /json HTTP/1.1\r\nHost: ratelimit\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"4;name=value\r\nWiki\r\n5\r\npedia\r\n0\r\nX-Checksum: 1\r\nX-More: 2\r\n\r\n"
        )
        answer = await raw.answer()
        assert answer.status == 200
        assert json.loads(answer.body) == {"method": "POST", "body": "Wikipedia"}
        await raw.send(get())  # the connection goes on
        assert (await raw.answer()).body == b"OK"


async def test_httpx_streams_a_chunked_body(port: int) -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b"{"
        yield b"x" * 5000
        yield b"}"

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        answered = await client.post("/json", content=parts())
    assert answered.status_code == 200
    assert answered.json()["body"] == "{" + "x" * 5000 + "}"


@pytest.mark.parametrize(
    "framing",
    [
        b"zz\r\nab\r\n0\r\n\r\n",  # not hexadecimal
        b"\r\n",  # no size at all
        b"2\nab\r\n0\r\n\r\n",  # a size line ending in a bare LF
        b"2\r\nabXY0\r\n\r\n",  # no CRLF after the data
        b"1;" + b"e" * 5000 + b"\r\na\r\n0\r\n\r\n",  # a size line over 4 KiB
        (b"1;" + b"e" * 4000 + b"\r\na\r\n") * 6 + b"0\r\n\r\n",  # extensions dwarfing the data
        b"0\r\nNo colon\r\n\r\n",  # a malformed trailer
        b"0\r\n" + (b"X: " + b"t" * 1000 + b"\r\n") * 5 + b"\r\n",  # a trailer over 4 KiB
        b"12345678901234567\r\n",  # a size of 17 hexadecimal digits
    ],
    ids=[
        "hex",
        "empty",
        "bare-lf",
        "no-crlf",
        "long-line",
        "overhead",
        "trailer",
        "long-trailer",
        "17-digits",
    ],
)
async def test_a_malformed_chunked_body_is_refused_400(port: int, framing: bytes) -> None:
    head = b"POST /json HTTP/1.1\r\nHost: ratelimit\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = await one(port, head + framing)
    assert (answer.status, answer.body) == (400, b"Bad Request\n")
    assert answer.headers["connection"] == "close"


async def test_a_chunked_body_cut_short_is_refused_400(port: int) -> None:
    head = b"POST /json HTTP/1.1\r\nHost: ratelimit\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = await one(port, head + b"5\r\nabc", end=True)
    assert answer.status == 400


async def test_a_chunked_body_over_max_body_is_refused_413(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "MAX_BODY", 8)
    head = b"POST /json HTTP/1.1\r\nHost: ratelimit\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert (await one(port, head + b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n")).status == 413
    async with connected(port) as raw:  # exactly MAX_BODY is read
        await raw.send(head + b"5\r\nhello\r\n3\r\nwor\r\n0\r\n\r\n")
        assert json.loads((await raw.answer()).body)["body"] == "hellowor"


@pytest.mark.parametrize(
    "codings", ["gzip, chunked", "identity", "chunked\r\nTransfer-Encoding: chunked"]
)
async def test_another_transfer_coding_is_refused_501(port: int, codings: str) -> None:
    request = f"POST /json HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: {codings}\r\n\r\n"
    answer = await one(port, request.encode())
    assert (answer.status, answer.body) == (501, b"Unsupported transfer encoding")


async def test_http10_ignores_transfer_encoding(port: int) -> None:
    """net/http (issue 12785) reads an HTTP/1.0 body by its Content-Length alone."""
    request = b"POST /json HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc"
    answer = await one(port, request)
    assert json.loads(answer.body)["body"] == "abc"


# 2. Expect: 100-continue


async def test_expect_100_continue_is_answered_before_the_body_is_sent(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(
            b"POST /json HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
        )
        assert await raw.exactly(len(CONTINUE)) == CONTINUE
        await raw.send(b"hello")
        assert json.loads((await raw.answer()).body)["body"] == "hello"
        await raw.send(
            b"POST /json HTTP/1.1\r\nHost: r\r\nExpect: 100-Continue\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        assert await raw.exactly(len(CONTINUE)) == CONTINUE
        await raw.send(b"3\r\nabc\r\n0\r\n\r\n")
        assert json.loads((await raw.answer()).body)["body"] == "abc"


async def test_no_100_continue_when_no_body_will_be_read(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "MAX_BODY", 4)
    expecting = "Host: r\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    too_large = await one(port, f"POST /json HTTP/1.1\r\n{expecting}".encode())
    assert (too_large.status_line, too_large.headers["connection"]) == (
        "HTTP/1.1 413 Request Entity Too Large",
        "close",
    )
    # net/http's 404 handler never reads the body: no 100, and the connection closes
    nowhere = await one(port, f"POST /nowhere HTTP/1.1\r\n{expecting}".encode())
    assert nowhere.status == 404
    # no body to wait for
    async with connected(port) as raw:
        await raw.send(b"GET /healthcheck HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\n\r\n")
        assert (await raw.answer()).status_line == "HTTP/1.1 200 OK"
    # HTTP/1.0 knows no 100 Continue
    async with connected(port) as raw:
        await raw.send(
            b"POST /json HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"
        )
        assert (await raw.answer()).status_line == "HTTP/1.0 200 OK"


async def test_another_expectation_is_refused_417(port: int) -> None:
    answer = await one(port, get("/healthcheck", "Expect: the-unexpected"))
    assert (answer.status, answer.headers["connection"], answer.body) == (417, "close", b"")


# 3. keep-alive, HEAD, request targets, pipelining, limits, malformed requests, timeouts


async def test_http10_keep_alive(port: int) -> None:
    async with connected(port) as raw:
        for _ in range(2):
            await raw.send(get("/healthcheck", "Connection: keep-alive", version="HTTP/1.0"))
            answer = await raw.answer()
            assert answer.status_line == "HTTP/1.0 200 OK"
            assert (answer.headers["connection"], answer.body) == ("keep-alive", b"OK")
        await raw.send(get("/healthcheck", version="HTTP/1.0"))  # without: closed after
        answer = await raw.answer()
        assert (answer.status_line, answer.body) == ("HTTP/1.0 200 OK", b"OK")
        assert "connection" not in answer.headers
        assert await raw.closed()


async def test_connection_close_among_other_tokens(port: int) -> None:
    answer = await one(port, get("/healthcheck", "Connection: TE, Close"))
    assert (answer.body, answer.headers["connection"]) == (b"OK", "close")


async def test_head_answers_the_headers_without_the_body(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(get().replace(b"GET", b"HEAD") + get())
        head = await raw.answer(head_only=True)
        assert (head.status, head.headers["content-length"]) == (200, "2")
        following = await raw.answer()
        assert (following.status_line, following.body) == ("HTTP/1.1 200 OK", b"OK")


@pytest.mark.parametrize(
    "target",
    [
        "http://ratelimit.example/healthcheck",
        "HTTP://ratelimit.example:8080/healthcheck?probe=1",
        "/healthcheck?probe=1",
        "/%68ealthcheck",
    ],
)
async def test_a_request_target_names_its_path(port: int, target: str) -> None:
    async with connected(port) as raw:
        await raw.send(get(target))
        assert (await raw.answer()).body == b"OK"


@pytest.mark.parametrize("target", ["healthcheck", "*", "/%zzhealthcheck", "/health\x01check"])
async def test_a_target_net_url_does_not_parse_is_refused_400(port: int, target: str) -> None:
    answer = await one(port, get(target))
    assert (answer.status, answer.body) == (400, b"400 Bad Request")


async def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(
            b"POST /json HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\n\r\nabc"
            + get("/nowhere")
            + b"POST /json HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nhi"
            + get("/healthcheck", "Connection: close")
        )
        assert json.loads((await raw.answer()).body)["body"] == "abc"
        assert (await raw.answer()).body == b"404 page not found\n"
        assert json.loads((await raw.answer()).body)["body"] == "hi"
        last = await raw.answer()
        assert (last.body, last.headers["connection"]) == (b"OK", "close")
        assert await raw.closed()


async def test_a_stray_crlf_after_a_post_body_is_skipped(port: int) -> None:
    """Old clients end a POST body with an extra CRLF; net/http skips up to 4 CR/LF bytes
    after a POST (RFC 7230 section 3.5)."""
    async with connected(port) as raw:
        await raw.send(b"POST /json HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nhi\r\n")
        assert json.loads((await raw.answer()).body)["body"] == "hi"
        await raw.send(get())
        assert (await raw.answer()).body == b"OK"


async def test_bare_lf_line_ends_are_read(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(b"GET /healthcheck HTTP/1.1\nHost: r\n\n")
        assert (await raw.answer()).body == b"OK"


async def test_a_folded_header_line_continues_the_field(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(b"GET /healthcheck HTTP/1.1\r\nHost: r\r\nX-Long: a\r\n  b\r\n\r\n")
        assert (await raw.answer()).body == b"OK"


async def test_a_head_up_to_net_https_limit_is_read(port: int) -> None:
    """net/http reads heads up to ``DefaultMaxHeaderBytes`` (1 MiB)."""
    async with connected(port) as raw:
        await raw.send(get("/healthcheck", "Cookie: " + "c" * 200_000, "X-More: " + "m" * 700_000))
        assert (await raw.answer()).body == b"OK"


@pytest.mark.parametrize(
    "fields",
    [
        ["X-Big: " + "a" * (http.MAX_HEAD + 10)],  # one line over the limit
        [f"X-Many-{n}: " + "a" * 60_000 for n in range(20)],  # lines adding up past it
    ],
    ids=["one-line", "many-lines"],
)
async def test_a_head_over_the_limit_is_refused_431(port: int, fields: list[str]) -> None:
    answer = await one(port, get("/healthcheck", *fields))
    assert answer.status_line == "HTTP/1.1 431 Request Header Fields Too Large"
    assert answer.body == b"431 Request Header Fields Too Large"
    assert answer.headers["connection"] == "close"


@pytest.mark.parametrize(
    "length",
    [
        "",
        "-1",
        "+5",
        "5x",
        "0x10",
        "1, 1",
        "²",
        "1³",
        "9" * 5000,
        str(1 << 63),
        "2\r\nContent-Length: 3",
    ],
    ids=[
        "empty",
        "negative",
        "plus",
        "suffix",
        "hex",
        "list",
        "superscript",
        "mixed",
        "5000-digits",
        "2**63",
        "differing",
    ],
)
async def test_a_bad_content_length_is_refused_400(port: int, length: str) -> None:
    request = f"POST /json HTTP/1.1\r\nHost: r\r\nContent-Length: {length}\r\n\r\nabc"
    answer = await one(port, request.encode("latin-1"))
    assert (answer.status, answer.headers["connection"]) == (400, "close")


async def test_repeated_equal_content_lengths_are_one(port: int) -> None:
    async with connected(port) as raw:
        await raw.send(
            b"POST /json HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\nContent-Length:  3\r\n\r\nabc"
        )
        assert json.loads((await raw.answer()).body)["body"] == "abc"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\r\n\r\n", 400),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /healthcheck\r\n\r\n", 400),
        (b"GET  /healthcheck HTTP/1.1\r\n\r\n", 400),
        (b"G@T /healthcheck HTTP/1.1\r\n\r\n", 400),
        (b"GET /healthcheck HTTP/1\r\n\r\n", 400),
        (b"GET /healthcheck http/1.1\r\n\r\n", 400),
        (b"GET /healthcheck HTTP/2.0\r\n\r\n", 505),
        (b"GET /healthcheck HTTP/0.9\r\n\r\n", 505),
        (b"GET /healthcheck HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET /healthcheck HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET /healthcheck HTTP/1.1\r\n X: folded first\r\n\r\n", 400),
        (b"GET /healthcheck HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET /healthcheck HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
    ],
)
async def test_a_malformed_request_is_answered_then_closed(
    port: int, request_bytes: bytes, status: int
) -> None:
    answer = await one(port, request_bytes)
    assert (answer.status, answer.headers["connection"]) == (status, "close")
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    "partial",
    [
        b"GET /heal",
        b"GET /healthcheck HTTP/1.1\r\nHost: r\r\n",
        b"POST /json HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc",
    ],
)
async def test_a_request_cut_short_is_answered_400(port: int, partial: bytes) -> None:
    """The client ended its side mid-request: net/http answers ``400`` (its
    ``io.ErrUnexpectedEOF``); an end of stream between requests closes quietly."""
    assert (await one(port, partial, end=True)).status == 400
    async with connected(port) as raw:
        await raw.send(get(), end=True)
        assert (await raw.answer()).body == b"OK"
        assert await raw.closed()


@pytest.mark.parametrize(
    "method", ["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "PURGE", "get"]
)
async def test_healthcheck_answers_any_method(port: int, method: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        answered = await client.request(method, "/healthcheck")
    assert (answered.status_code, answered.text) == (200, "OK")


def test_the_timeout_is_a_generous_minute() -> None:
    assert http.TIMEOUT == 60.0


async def test_an_idle_connection_is_closed(port: int, quick: float) -> None:
    async with connected(port) as raw:
        assert await raw.closed()
    async with connected(port) as raw:  # idle after a reply, kept alive
        await raw.send(get())
        assert (await raw.answer()).body == b"OK"
        assert await raw.closed()


@pytest.mark.parametrize(
    "partial",
    [
        b"GET /heal",
        b"GET /healthcheck HTTP/1.1\r\nHost: r\r\n",
        b"POST /json HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc",
        b"POST /json HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    ],
)
async def test_a_request_stuck_midway_is_closed(port: int, quick: float, partial: bytes) -> None:
    async with connected(port) as raw:
        await raw.send(partial)
        assert await raw.closed()


def serving() -> list[asyncio.Task[object]]:
    """The listener's connection tasks still running."""
    return [
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") == "serve_http.<locals>.connected"
    ]


async def test_a_reply_never_read_is_dropped(
    port: int, quick: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "LINGER", 0.05)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    _, writer = await asyncio.open_connection(sock=client)
    try:
        writer.write(get("/large"))
        await writer.drain()
        deadline = time.monotonic() + PROMPT
        while not serving():  # the request arrives
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        while serving():  # and the reply, never read, is given up
            assert time.monotonic() < deadline, "the connection is held for ever"
            await asyncio.sleep(0.01)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# 4. Date, Content-Type and X-Content-Type-Options


DATE = re.compile(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT")


async def test_replies_carry_date_and_error_replies_nosniff(port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        replies = {
            "ok": await client.get("/healthcheck"),
            "json": await client.post("/json", content=b"{}"),
            "missing": await client.get("/nowhere"),
            "refused": await client.get("/refused"),
            "broken": await client.get("/broken"),
            "unhealthy": await client.get("/unhealthy"),
        }
    for name, answered in replies.items():
        date = answered.headers["date"]
        assert DATE.fullmatch(date), name
        assert abs(parsedate_to_datetime(date).timestamp() - time.time()) < 60, name
    for name in ("missing", "refused", "broken"):  # http.Error's replies
        assert replies[name].headers["content-type"] == "text/plain; charset=utf-8", name
        assert replies[name].headers["x-content-type-options"] == "nosniff", name
    assert (replies["missing"].status_code, replies["missing"].text) == (
        404,
        "404 page not found\n",
    )
    assert (replies["broken"].status_code, replies["broken"].text) == (
        500,
        "Internal Server Error\n",
    )
    for name in ("ok", "json"):
        assert "x-content-type-options" not in replies[name].headers, name
    assert replies["json"].headers["content-type"] == "application/json"
    # an empty content type sends none, as net/http does for an empty body
    assert "content-type" not in replies["unhealthy"].headers
    assert replies["unhealthy"].headers["content-length"] == "0"
