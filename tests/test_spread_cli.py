"""Issue 38: ``ratelimit check`` says where a tree lives on a Redis Cluster; cluster URLs
(``redis+cluster://``) open a ``RedisCluster``; ``--spread`` / ``RATELIMIT_SPREAD`` give the
``spread`` setting to the command and the service."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from ratelimit import RateLimit
from ratelimit.backends.redis.client import (
    CLUSTER_TRANSACTIONS,
    check_redis_url,
    client_from_url,
    redis_py_version,
)
from ratelimit.backends.urls import USE, storage_url_problem
from ratelimit.cli.command import main as cli
from ratelimit.cli.common import limiter_of
from ratelimit.cli.explain import placement
from ratelimit.rules.tree import Or, Rule, to_tree
from tests.redis_server import RedisCluster

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        (
            "user:5/m | user:100/h",
            "on a Redis Cluster: spread by user (each user's counters in a slot of their own)",
        ),
        (
            "apikey:90000 tokens/m & apikey:100/m",
            "on a Redis Cluster: spread by apikey (each apikey's counters in a slot of their own)",
        ),
        (
            "user:5/m | ip:10/m",
            "on a Redis Cluster: each user's and each ip's counters in a slot of their own: a "
            "call spans 2 slots, decided by parts",
        ),
        (
            "user:5/m | ip:10/m | apikey:1/s",
            "on a Redis Cluster: each user's, each ip's and each apikey's counters in a slot of "
            "their own: a call spans 3 slots, decided by parts",
        ),
        (
            "apikey:100/h & 10/s",
            "on a Redis Cluster: each apikey's counters in a slot of their own, the whole key's "
            "in the key's own: a call spans 2 slots, decided by parts",
        ),
        (
            "10/s | 100/h",
            "on a Redis Cluster: one slot for the whole key (no rule names a selector)",
        ),
    ],
)
def test_placement_says_where_a_tree_lives_on_a_cluster(rules: str, words: str) -> None:
    assert placement(to_tree(rules)) == words


def test_placement_of_a_selector_named_twice() -> None:
    tree = Or(Rule(5, 60_000, selector="user"), Rule(9, 60_000, selector="user#1"))
    assert placement(tree) == (
        "on a Redis Cluster: each user's counters in a slot of their own: a call spans 2 "
        "slots, decided by parts"
    )


def test_check_prints_the_placement(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["check", "user:5/m | user:100/h"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == (
        "  on a Redis Cluster: spread by user (each user's counters in a slot of their own)"
    )
    assert cli(["check", str(ROOT / "examples" / "service_rules.toml")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "on a Redis Cluster: one slot per domain (pinned: the service decides a request's "
        "descriptors together, atomically)"
    )


def test_cluster_urls_are_storage_urls() -> None:
    assert "redis+cluster://" in USE
    assert "rediss+cluster://" in USE
    assert storage_url_problem("redis+cluster://127.0.0.1:7000") is None
    assert storage_url_problem("rediss+cluster://u:p@h:7000/0?socket_timeout=2") is None
    assert storage_url_problem("redis+cluster://h:7000/2") == (
        "a Redis Cluster has database 0 only, not 2 (redis+cluster://host:port)"
    )
    assert storage_url_problem("redis+cluster://") == (
        "redis+cluster:// names one node of the cluster: host[:port]"
    )
    assert storage_url_problem("redis+cluster://h:port") is not None
    check_redis_url("redis+cluster://h")  # the default port


async def test_a_cluster_url_opens_a_cluster_client_that_spreads() -> None:
    client = client_from_url("rediss+cluster://h:7001")  # connects at its first command
    assert isinstance(client, AsyncRedisCluster)
    await client.aclose()
    rl = RateLimit.from_url("redis+cluster://127.0.0.1:7001")
    assert rl.storage.spread is True  # type: ignore[attr-defined]
    off = RateLimit.from_url("redis+cluster://127.0.0.1:7001", spread=False)
    assert off.storage.spread is False  # type: ignore[attr-defined]
    await rl.aclose()
    await off.aclose()


def _args(spread: str, algorithm: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(namespace="", algorithm=algorithm, spread=spread)


@pytest.mark.parametrize(
    ("spread", "url", "expected"),
    [
        ("auto", "redis://127.0.0.1:1", False),
        ("on", "redis://127.0.0.1:1", True),
        ("auto", "redis+cluster://127.0.0.1:1", True),
        ("off", "redis+cluster://127.0.0.1:1", False),
    ],
)
def test_the_commands_limiter_takes_spread(spread: str, url: str, expected: bool) -> None:
    assert limiter_of(_args(spread), url).storage.spread is expected  # type: ignore[attr-defined]


def test_other_stores_ignore_spread() -> None:
    limiter_of(_args("on"), "memory://")  # no error: memory never spreads


def test_spread_defaults_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ratelimit.cli.command import parser

    monkeypatch.setenv("RATELIMIT_SPREAD", "off")
    args = parser().parse_args(["peek", "--key", "k", "user:1/m"])
    assert args.spread == "off"
    assert parser().parse_args(["reset", "--spread", "on", "--key", "k", "1/m"]).spread == "on"
    monkeypatch.setenv("RATELIMIT_SPREAD", "sideways")
    with pytest.raises(SystemExit) as usage:
        cli(["peek", "--key", "k", "user:1/m"])
    assert usage.value.code == 2
    assert "RATELIMIT_SPREAD='sideways': use auto, on or off" in capsys.readouterr().err


def test_the_service_reads_ratelimit_spread() -> None:
    pytest.importorskip("grpc")
    from ratelimit.errors import ConfigurationError
    from ratelimit.service.config import ServiceConfig

    assert ServiceConfig.from_env({}).spread is None
    on = ServiceConfig.from_env({"RATELIMIT_SPREAD": "on", "RATELIMIT_STORAGE": "redis://h"})
    assert (on.spread, on.store_spread()) == (True, True)
    off = ServiceConfig.from_env({"RATELIMIT_SPREAD": "OFF"})
    assert (off.spread, off.store_spread()) == (False, None)  # memory:// never spreads
    assert ServiceConfig.from_env({"RATELIMIT_SPREAD": "auto"}).spread is None
    with pytest.raises(ConfigurationError, match="RATELIMIT_SPREAD='x'"):
        ServiceConfig.from_env({"RATELIMIT_SPREAD": "x"})


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as started:
        yield started


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.timeout(60)
def test_the_command_reaches_a_cluster(
    cluster: RedisCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    url = cluster.url.replace("redis://", "redis+cluster://", 1)
    base = ["--storage", url, "--namespace", "cli-cluster", "--key", "k"]
    assert cli(["peek", *base, "user:1/m", "user=ann"]) == 0
    assert "nothing counted" in capsys.readouterr().out
    assert cli(["reset", *base, "--spread", "off", "user:1/m", "user=ann"]) == 0
    if redis_py_version() >= CLUSTER_TRANSACTIONS:  # overrides are written in a transaction
        assert cli(["override", "set", "--storage", url, "--key", "k", "user=ann", "user:5/m"]) == 0
        assert cli(["override", "get", "--storage", url, "--key", "k", "user=ann"]) == 0
        assert "user:5/m" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("given", "read"),
    [("true", "on"), ("1", "on"), ("FALSE", "off"), ("0", "off"), ("", "auto"), ("Off", "off")],
)
def test_the_command_reads_spread_from_the_environment_as_the_service_does(
    given: str, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratelimit.cli.common import default_spread

    monkeypatch.setenv("RATELIMIT_SPREAD", given)
    assert default_spread() == read
