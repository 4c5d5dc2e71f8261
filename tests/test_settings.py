"""One settings object: named, defaulted and checked once; RateLimit and from_url share it."""

from __future__ import annotations

import dataclasses
import typing

import fakeredis
import pytest
import redis.asyncio

from ratelimit import ConfigurationError, MemoryBackend, RateLimit, Settings
from ratelimit.backends import RedisScriptBackend
from ratelimit.backends.synced import SyncedBackend
from ratelimit.core.settings import SettingsKeywords


def test_settings_are_frozen_and_checked_when_made() -> None:
    settings = Settings(namespace="shop", algorithm="sliding-window", hooks=[print])
    assert settings.hooks == (print,)  # a list given is copied into a tuple
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timeout = 1.0  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="unknown algorithm 'token-bucket'"):
        Settings(algorithm="token-bucket")
    with pytest.raises(ConfigurationError, match="on_error must be one of"):
        settings.replace(on_error="ignore")
    with pytest.raises(TypeError, match="positional"):
        Settings("shop")  # type: ignore[call-arg]


def test_the_keywords_are_the_settings() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(Settings)}
    keywords = typing.get_type_hints(SettingsKeywords)
    assert set(keywords) == set(fields) - {"namespace"}  # namespace is an argument of its own
    hints = typing.get_type_hints(Settings)
    assert all(keywords[name] == hints[name] for name in keywords)


def test_from_url_types_every_setting() -> None:
    hints = typing.get_type_hints(RateLimit.from_url)
    keywords = typing.get_type_hints(SettingsKeywords)
    assert {name: hints[name] for name in keywords} == keywords
    # mypy --strict (CI) flags an unused ignore: this line holds only while the keyword is
    # typed, so a type checker catches the mistake before it runs
    with pytest.raises(TypeError, match="denial_cache"):
        RateLimit.from_url("memory://", denial_cache="10")  # type: ignore[arg-type]


async def test_a_limiter_takes_settings_made_beforehand() -> None:
    settings = Settings(namespace="a", algorithm="fixed-window", denial_cache=0)
    rl = RateLimit(MemoryBackend(), settings=settings)
    assert rl.settings is settings
    assert (rl.namespace, rl.algorithm) == ("a", "fixed-window")
    other = RateLimit(MemoryBackend(), "b", settings=settings, on_error="deny")
    assert other.settings == settings.replace(namespace="b", on_error="deny")
    by_url = RateLimit.from_url("memory://", settings=settings)
    assert by_url.settings is settings
    with pytest.raises(TypeError, match="settings must be a ratelimit.Settings"):
        RateLimit(MemoryBackend(), settings={"namespace": "a"})  # type: ignore[arg-type]
    for limiter in (rl, other, by_url):
        await limiter.aclose()


async def test_from_url_sends_settings_to_settings_and_the_rest_to_redis() -> None:
    rl = RateLimit.from_url(
        "redis://127.0.0.1:1/0", "ns", timeout=1.0, max_connections=3, algorithm="fixed-window"
    )
    assert rl.settings.timeout == 1.0
    assert rl.settings.algorithm == "fixed-window"
    assert isinstance(rl.storage, RedisScriptBackend)
    client = rl.storage.client
    assert isinstance(client, redis.asyncio.Redis)  # not a cluster: one pool
    pool = client.connection_pool
    assert pool.max_connections == 3
    assert "timeout" not in pool.connection_kwargs
    await rl.aclose()


async def test_the_backend_is_chosen_before_one_is_built() -> None:
    client = fakeredis.FakeAsyncRedis()
    local = RateLimit(client, sync_rate=-1, algorithm="sliding-window")
    assert type(local.storage) is MemoryBackend
    assert not hasattr(local, "_unused")
    synced = RateLimit(client, sync_rate=1.0, algorithm="sliding-window")
    assert isinstance(synced.storage, SyncedBackend)
    # local only by URL: no Redis client is opened at all
    by_url = RateLimit.from_url("redis://127.0.0.1:1/0", sync_rate=-1, algorithm="fixed-window")
    assert type(by_url.storage) is MemoryBackend
    for limiter in (local, synced, by_url):
        await limiter.aclose()
    await client.aclose()
