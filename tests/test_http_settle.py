"""Costs from the request and settles from the response at the HTTP edge, under a real
uvicorn with counters in a real Redis (tests/http_token_apps.py): a route reserves the
request's ``max_tokens`` and settles what the response reports, in a header or through a
callable; the ``RateLimit`` fields say the token rule counts tokens."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.http_server import UvicornServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
_keys = itertools.count(1)


@pytest.fixture(scope="module")
def server(redis_url: str) -> Iterator[UvicornServer]:
    env = {"RL_TEST_STORAGE": redis_url}
    with UvicornServer("tests.http_token_apps:app", env, factory=True) as running:
        yield running


def api_key() -> dict[str, str]:
    return {"x-api-key": f"key-{next(_keys)}"}


@pytest.mark.parametrize("path", ["/complete", "/embed"])
async def test_a_route_reserves_the_request_s_tokens_and_settles_the_response_s(
    server: UvicornServer, path: str
) -> None:
    key = api_key()
    async with server.client(headers=key) as http:
        for _ in range(5):  # each reserves 400 and uses 100: unsettled, the third is refused
            response = await http.get(path, params={"max_tokens": 400, "used": 100})
            assert response.status_code == 200
        fits = await http.get(path, params={"max_tokens": 500, "used": 500})
        assert fits.status_code == 200  # 500 used, 500 left
        refused = await http.get(path, params={"max_tokens": 1, "used": 1})
    assert refused.status_code == 429
    assert "api:1000 tokens/m" in refused.json()["violated-policies"]


async def test_a_response_that_reports_nothing_leaves_the_reservation(
    server: UvicornServer,
) -> None:
    key = api_key()
    async with server.client(headers=key) as http:
        failed = await http.get("/embed", params={"max_tokens": 600, "status": 500})
        assert failed.status_code == 500  # reported nothing to settle: 600 stay counted
        assert (await http.get("/embed", params={"max_tokens": 401})).status_code == 429
        assert (await http.get("/embed", params={"max_tokens": 400})).status_code == 200


async def test_the_token_rule_says_what_it_counts(server: UvicornServer) -> None:
    async with server.client(headers=api_key()) as http:
        response = await http.get("/complete", params={"max_tokens": 10, "used": 5})
    policy = response.headers["ratelimit-policy"]
    assert '"api:100/m";q=100;w=60' in policy
    assert '"api:1000 tokens/m";q=1000;w=60;ratelimit-unit="tokens"' in policy
    assert '"api:1000 tokens/m";r=990;' in response.headers["ratelimit"]  # before the settle
