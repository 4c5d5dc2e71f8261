"""A keyword nothing reads is refused where it is given, never taken and ignored:

- ``limit()`` and ``concurrency()``: a keyword that names no selector of the rules (known
  where the limit is made) says whether it is a limiter setting (and where that goes) or
  which selector (or keyword) it may have meant;
- ``RateLimit.from_url`` (async and sync) and ``RateLimit(...)``: a keyword that is
  neither a setting nor an option the URL scheme's client takes, before any client is
  opened (handed to redis-py, it failed every decision, which ``on_error="allow"`` then
  admitted: past any limit).
"""

from __future__ import annotations

from typing import Any

import pytest

import ratelimit.sync
from ratelimit import ConfigurationError, MemoryBackend, RateLimit

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rl() -> RateLimit:
    return RateLimit(MemoryBackend())


def test_a_setting_given_to_limit_says_where_it_goes(rl: RateLimit) -> None:
    with pytest.raises(ConfigurationError) as refused:
        rl.limit("5/s", algorithm="gcra")
    message = str(refused.value)
    assert "limit('5/s'): algorithm= is a setting of the limiter, not of one limit" in message
    assert "RateLimit.from_url(url, algorithm=...)" in message
    with pytest.raises(ConfigurationError, match="on_error= is a setting of the limiter"):
        rl.limit("user:5/s", on_error="deny", user="u")


def test_a_misspelt_selector_names_the_nearest(rl: RateLimit) -> None:
    with pytest.raises(ConfigurationError) as refused:
        rl.limit("apikey:100/h & (10/s | 15/m)", apikye=lambda: "k")
    assert "apikye= names no selector of its rules (its rules' selectors: apikey)" in str(
        refused.value
    )
    assert "did you mean apikey=?" in str(refused.value)
    with pytest.raises(ConfigurationError, match="did you mean cost=?"):
        rl.limit("user:5/s", cots=2, user="u")
    with pytest.raises(ConfigurationError, match=r"user= names no selector .*\(it has none\)"):
        rl.limit("5/s", user="u")


def test_the_selectors_of_the_rules_are_taken(rl: RateLimit) -> None:
    rl.limit("apikey:100/h & (ip:10/s | 15/m)", apikey="k", ip="1.2.3.4")
    rl.limit({"free": "apikey:5/m", "pro": "apikey:50/m"}, apikey="k", tier=lambda: "pro")
    rl.limit(lambda: "user:5/m", user="u", anything="else")  # rules known per call only
    rl.limit(key="registered-later", whatever="x")  # rules known at the first call


def test_concurrency_refuses_a_keyword_of_no_selector(rl: RateLimit) -> None:
    with pytest.raises(ConfigurationError, match="concurrency\\('user:5'\\): priority= names"):
        rl.concurrency("user:5", user="u", priority="high")
    rl.concurrency("user:5", user="u", reserve={"critical": 1}, priority="critical")


def test_the_sync_limit_refuses_them_too() -> None:
    with (
        ratelimit.sync.RateLimit.from_url("memory://") as rl,
        pytest.raises(ConfigurationError, match="did you mean apikey="),
    ):
        rl.limit("apikey:5/s", apikye="k")


def test_from_url_refuses_a_keyword_neither_setting_nor_client_option() -> None:
    with pytest.raises(TypeError) as refused:
        RateLimit.from_url("redis://127.0.0.1:1/0", timout=1)
    message = str(refused.value)
    assert "RateLimit.from_url() got an unknown keyword timout=" in message
    assert "nor one of the options of the redis:// client" in message
    assert "did you mean timeout= (a setting)?" in message
    with pytest.raises(TypeError, match="did you mean socket_timeout= \\(a client option\\)"):
        RateLimit.from_url("redis://127.0.0.1:1/0", socket_timout=1)
    with pytest.raises(TypeError, match="ssl_certfile"):  # a TLS option on a plain URL
        RateLimit.from_url("redis://127.0.0.1:1/0", ssl_certfile="c.pem")
    with pytest.raises(TypeError, match="did you mean max_size="):
        RateLimit.from_url("postgresql://app@db/app", max_sise=3)
    with pytest.raises(TypeError, match="memory:// takes no options"):
        RateLimit.from_url("memory://", socket_timeout=1)


def test_from_url_passes_on_what_the_client_takes() -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("redis://127.0.0.1:1/0", {"socket_timeout": 1, "max_connections": 4}),
        ("rediss://127.0.0.1:1/0", {"ssl_cert_reqs": "none", "health_check_interval": 5}),
        ("unix:///tmp/none.sock", {"socket_timeout": 1}),
        ("redis+cluster://127.0.0.1:1", {"require_full_coverage": True}),
        ("redis+sentinel://127.0.0.1:1/main", {"socket_timeout": 1}),
    ]
    for url, options in cases:
        rl = RateLimit.from_url(url, **options)  # opens nothing yet
        assert rl.storage is not None


def test_the_options_of_a_connection_class_given_are_passed_on() -> None:
    from redis.asyncio.connection import SSLConnection

    RateLimit.from_url(
        "redis://127.0.0.1:1/0", connection_class=SSLConnection, ssl_cert_reqs="none"
    )
    RateLimit.from_url("redis+cluster://127.0.0.1:1", connection_class=SSLConnection)


def test_made_with_an_unknown_setting_names_the_settings() -> None:
    with pytest.raises(TypeError) as refused:
        RateLimit(MemoryBackend(), timout=1)  # type: ignore[call-arg]
    assert "RateLimit() got an unknown keyword timout=" in str(refused.value)
    assert "did you mean timeout= (a setting)?" in str(refused.value)
    with pytest.raises(TypeError, match="unknown keyword timout="):
        ratelimit.sync.RateLimit(MemoryBackend(), timout=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="did you mean timeout="):
        ratelimit.sync.RateLimit.from_url("redis://127.0.0.1:1/0", timout=1)
