"""The service's namespace is the library's (``""``), and a service upgraded from the old
default (``"ratelimit"``) is told at start of the overrides it left there."""

from __future__ import annotations

import logging

import pytest

from ratelimit import MemoryBackend, RateLimit
from ratelimit.errors import BackendError
from ratelimit.service import server
from ratelimit.service.config import ServiceConfig
from ratelimit.service.observing import WORKER
from ratelimit.service.upgrading import warn_of_old_namespace

pytestmark = pytest.mark.timeout(60)


def test_the_namespace_is_the_librarys_unless_the_variable_says() -> None:
    assert ServiceConfig().namespace == ""
    config = ServiceConfig.from_env({})
    assert (config.namespace, config.namespace_given) == ("", False)
    config = ServiceConfig.from_env({"RATELIMIT_NAMESPACE": "ratelimit"})
    assert (config.namespace, config.namespace_given) == ("ratelimit", True)
    config = ServiceConfig.from_env({"RATELIMIT_NAMESPACE": ""})  # set, to the default
    assert (config.namespace, config.namespace_given) == ("", True)


async def test_overrides_left_under_the_old_default_are_named_once_at_start(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WORKER, raising=False)
    store = MemoryBackend()
    old = RateLimit(store, "ratelimit")  # what an older service kept
    service = RateLimit(store)  # the service now: the library's default namespace
    config = ServiceConfig.from_env({})
    assert await warn_of_old_namespace(service, config) is None  # nothing anywhere
    await old.overrides.set("envoy/edge", "1000/h", remote_address="10.0.0.1")
    await old.overrides.set("ratio", "5/m", ttl=60)

    with caplog.at_level(logging.WARNING, logger="ratelimit.service"):
        said = await warn_of_old_namespace(service, config)
    assert said == (
        "ratelimit: 2 overrides kept under namespace 'ratelimit', the service's default "
        "before it became the library's '', and none under '': set "
        "RATELIMIT_NAMESPACE=ratelimit to keep applying them (and counting on the counters "
        "kept there), or RATELIMIT_NAMESPACE= (empty) to start afresh and not be warned again"
    )
    assert [r.getMessage() for r in caplog.records] == [said]

    given = ServiceConfig.from_env({"RATELIMIT_NAMESPACE": ""})
    assert await warn_of_old_namespace(service, given) is None  # the variable was set
    monkeypatch.setenv(WORKER, "1")
    assert await warn_of_old_namespace(service, config) is None  # worker 0 says it
    monkeypatch.setenv(WORKER, "0")
    assert await warn_of_old_namespace(service, config) is not None
    await service.overrides.set("ratio", "9/m")
    assert await warn_of_old_namespace(service, config) is None  # in use under '' already
    await old.aclose()


async def test_expired_overrides_and_a_failing_store_say_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(WORKER, raising=False)
    now = [1_000.0]
    store = MemoryBackend(clock=lambda: now[0])
    old = RateLimit(store, "ratelimit")
    await old.overrides.set("ratio", "5/m", ttl=60)
    service = RateLimit(store)
    assert await warn_of_old_namespace(service, ServiceConfig.from_env({})) is not None
    now[0] += 61  # expired, by the store's clock
    assert await warn_of_old_namespace(service, ServiceConfig.from_env({})) is None

    async def failing(namespace: str) -> tuple[int, dict[str, str]]:
        raise BackendError("storage down")

    monkeypatch.setattr(store, "overrides_load", failing)
    assert await warn_of_old_namespace(service, ServiceConfig.from_env({})) is None


async def test_serve_looks_once_it_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[RateLimit, ServiceConfig]] = []

    async def look(limiter: RateLimit, config: ServiceConfig) -> None:
        seen.append((limiter, config))

    async def run(self: server.Service) -> None:
        await self.shutdown()

    monkeypatch.setattr(server, "warn_of_old_namespace", look)
    monkeypatch.setattr(server.Service, "run", run)
    config = ServiceConfig(port=0, host="127.0.0.1", metrics="none")
    await server.serve(config)
    assert [seen_config for _, seen_config in seen] == [config]
