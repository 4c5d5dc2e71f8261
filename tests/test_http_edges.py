"""The HTTP edge under a real uvicorn, driven by httpx over TCP and over a unix socket
(``--uds``): which forwarded header a trusted proxy is believed for, clients behind a unix
socket, routes under ``--root-path`` and in a mounted application, and JSON values that the
endpoint reads as one account (tests/http_edge_apps.py serves them)."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http_server import UvicornServer

pytestmark = pytest.mark.timeout(120)

APPS = "tests.http_edge_apps"
_clients = itertools.count(1)


def new_address() -> str:
    n = next(_clients)
    return f"198.51.{n // 250}.{n % 250 + 1}"


def statuses(answers: list[httpx.Response]) -> list[int]:
    return [answer.status_code for answer in answers]


@pytest.fixture
def socket_path() -> Iterator[str]:
    """A unix socket's path, short enough for AF_UNIX (108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="rl-") as directory:
        yield str(Path(directory) / "uvicorn.sock")


def serve(app: str, env: dict[str, str] | None = None, **options: object) -> UvicornServer:
    return UvicornServer(f"{APPS}:{app}", env, factory=True, **options)  # type: ignore[arg-type]


# --- item 1: only the header the trusted proxy sets is believed ---


@pytest.fixture(scope="module")
def behind_nginx() -> Iterator[UvicornServer]:
    """Trusting 127.0.0.1, which appends X-Forwarded-For (nginx, AWS ALB): the default."""
    with serve("proxied_app", {"RL_TEST_TRUSTED": "127.0.0.1"}) as server:
        yield server


@pytest.mark.parametrize("path", ["/ping", "/dependency"])
async def test_a_client_written_forwarded_header_is_not_believed(
    behind_nginx: UvicornServer, path: str
) -> None:
    """The proxy appends the real client to X-Forwarded-For; the client adds a Forwarded
    header of its own, new each time. It is one client: 5 of 20 through ``ip:5/m``."""
    real = new_address()
    async with behind_nginx.client() as http:
        answers = [
            await http.get(
                path, headers={"forwarded": f"for=203.0.113.{n}", "x-forwarded-for": real}
            )
            for n in range(20)
        ]
    assert statuses(answers) == [200] * 5 + [429] * 15


async def test_repeated_forwarding_lines_are_one_chain(behind_nginx: UvicornServer) -> None:
    """A client's own X-Forwarded-For line, then the proxy's: read in order, the proxy's
    entry names the client."""
    real = new_address()
    async with behind_nginx.client() as http:
        answers = [
            await http.get(
                "/ping",
                headers=[("x-forwarded-for", f"10.9.9.{n}"), ("x-forwarded-for", real)],
            )
            for n in range(7)
        ]
        other = await http.get("/ping", headers={"x-forwarded-for": new_address()})
    assert statuses(answers) == [200] * 5 + [429] * 2
    assert other.status_code == 200


@pytest.mark.parametrize("path", ["/ping", "/dependency"])
def test_a_proxy_that_writes_forwarded_is_believed_for_that_header_only(path: str) -> None:
    env = {"RL_TEST_TRUSTED": "127.0.0.1", "RL_TEST_FORWARDED": "forwarded"}
    real = f"for={new_address()}"
    with serve("proxied_app", env) as server, server.sync_client() as http:
        spoofed = [
            http.get(path, headers={"x-forwarded-for": f"203.0.113.{n}", "forwarded": real})
            for n in range(7)
        ]
        # two Forwarded lines (the client's, then the proxy's), quoted with a port
        proxy = ("forwarded", f'for="{new_address()}:4711";proto=http')
        lines = [
            http.get(path, headers=[("forwarded", f"for=10.9.9.{n}"), proxy]) for n in range(6)
        ]
        other = http.get(path, headers={"forwarded": f"for={new_address()}"})
    assert statuses(spoofed) == [200] * 5 + [429] * 2
    assert statuses(lines) == [200] * 5 + [429]
    assert other.status_code == 200


def test_a_proxy_that_sets_x_real_ip() -> None:
    env = {"RL_TEST_TRUSTED": "127.0.0.1", "RL_TEST_FORWARDED": "x-real-ip"}
    real = new_address()
    with serve("proxied_app", env) as server, server.sync_client() as http:
        answers = [
            http.get(
                "/ping",
                headers={
                    "x-real-ip": real,
                    "x-forwarded-for": f"203.0.113.{n}",
                    "forwarded": f"for=203.0.114.{n}",
                },
            )
            for n in range(7)
        ]
        other = http.get("/ping", headers={"x-real-ip": new_address()})
    assert statuses(answers) == [200] * 5 + [429] * 2
    assert other.status_code == 200


# --- item 2: a unix socket ---


async def test_a_unix_socket_without_a_trusted_proxy_is_one_unknown_client(
    socket_path: str,
) -> None:
    """No peer address and no proxy trusted: every request counts as the one client
    ``unknown`` (not unlimited), and a warning says so once."""
    with serve("proxied_app", uds=socket_path) as server:
        async with server.client() as http:
            answers = [
                await http.get("/ping", headers={"x-forwarded-for": new_address()})
                for _ in range(12)
            ]
            inner = [await http.get("/dependency") for _ in range(6)]
        output = server.stop()
    assert statuses(answers) == [200] * 5 + [429] * 7
    assert statuses(inner) == [200] * 5 + [429]
    assert output.count("client addresses are unknown") == 2, output  # one per limit
    assert "trusted_proxies=['unix']" in output


@pytest.mark.parametrize("trusted", ["unix", "*"])
async def test_a_trusted_proxy_on_a_unix_socket_names_the_client(
    socket_path: str, trusted: str
) -> None:
    env = {"RL_TEST_TRUSTED": trusted}
    with serve("proxied_app", env, uds=socket_path) as server:
        async with server.client() as http:
            for path in ("/ping", "/dependency"):
                client = {"x-forwarded-for": new_address()}
                answers = [await http.get(path, headers=client) for _ in range(6)]
                other = await http.get(path, headers={"x-forwarded-for": new_address()})
                assert statuses(answers) == [200] * 5 + [429], path
                assert other.status_code == 200, path
            # the proxy sent no header: one "unknown" client, never unlimited
            bare = [await http.get("/ping") for _ in range(6)]
        output = server.stop()
    assert statuses(bare) == [200] * 5 + [429]
    assert output.count("client addresses are unknown") == 1, output


# --- item 3: root_path and mounts ---


@pytest.mark.parametrize("app", ["starlette_paths", "fastapi_paths"])
async def test_routes_match_under_root_path(app: str) -> None:
    """``uvicorn --root-path /api``: the application routes on ``/ping``, and so do the
    middleware's routes, its exclusions and the dependency's key."""
    with serve(app, extra=["--root-path", "/api"]) as server:
        await check_paths(server, "", "/api")


async def test_routes_match_in_a_mounted_application() -> None:
    with serve("mounted_paths") as server:
        for prefix in ("/v1", "/v2"):
            await check_paths(server, prefix, prefix)


async def check_paths(server: UvicornServer, prefix: str, root: str) -> None:
    async with server.client() as http:

        async def get(path: str, n: int) -> list[httpx.Response]:
            client = {"x-forwarded-for": new_address()}
            return [await http.get(prefix + path, headers=client) for _ in range(n)]

        pings = await get("/ping", 6)
        health = await get("/health", 10)
        other = await get("/other", 4)
        client = {"x-forwarded-for": new_address()}
        items = [await http.get(f"{prefix}/items/{n}", headers=client) for n in range(3)]
    assert statuses(pings) == [200] * 5 + [429], prefix
    assert pings[0].headers["ratelimit-policy"] == '"ip:5/m";q=5;w=60'
    assert statuses(health) == [200] * 10
    assert all("ratelimit" not in answer.headers for answer in health)
    assert statuses(other) == [200] * 3 + [429]
    assert statuses(items) == [200, 200, 429]
    # the dependency's key is the route's template, the same under any prefix
    assert [item.json()["key"] for item in items[:2]] == ["view GET /items/{item}"] * 2
    assert items[0].json()["path"] == f"{root}/items/0"


# --- item 7: one account, however the JSON spells it ---


@pytest.fixture(scope="module")
def typed_accounts() -> Iterator[UvicornServer]:
    with serve("accounts_app", {"RL_TEST_TYPED": "int"}) as server:
        yield server


async def test_every_spelling_of_one_integer_is_one_account(
    typed_accounts: UvicornServer,
) -> None:
    """FastAPI validates each of these to 7: ``json_field("account", type=int)`` counts
    them as 7, so 3 of 18 pass ``account:3/h``."""
    spellings = [b"7", b'"7"', b"7.0", b'" 7"', b'"07"', b'"+7"']
    async with typed_accounts.client() as http:
        answers = [
            await http.post("/transfer", content=b'{"account": %s}' % raw, headers=JSON)
            for raw in spellings * 3
        ]
        other = await http.post("/transfer", json={"account": 8})
    assert statuses(answers) == [200] * 3 + [429] * 15
    assert [answer.json()["account"] for answer in answers[:3]] == [7, 7, 7]
    assert other.status_code == 200


async def test_a_value_that_is_not_an_integer_is_refused_uncounted(
    typed_accounts: UvicornServer,
) -> None:
    async with typed_accounts.client() as http:
        bad = [await http.post("/transfer", json={"account": value}) for value in ("x", 7.5, [9])]
        account = [await http.post("/transfer", json={"account": 9}) for _ in range(4)]
    for answer in bad:
        assert answer.status_code == 422
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["status"] == 422
        assert "json_field('account', type=int)" in problem["detail"]
    assert statuses(account) == [200] * 3 + [429]  # nothing was counted for the bad ones


async def test_without_a_type_json_numbers_are_counted_by_value() -> None:
    """No ``type``: 7, 7.0 and "7" are one account (the number's value, as text)."""
    with serve("accounts_app") as server:
        async with server.client() as http:
            answers = [
                await http.post("/transfer", content=b'{"account": %s}' % raw, headers=JSON)
                for raw in [b"7", b"7.0", b'"7"', b"7e0", b"7.00", b"-0.0"]
            ]
    assert statuses(answers) == [200] * 3 + [429] * 2 + [200]


JSON = {"content-type": "application/json"}
