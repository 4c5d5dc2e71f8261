"""``ratelimit.sync.RateLimit`` takes the settings the async limiter takes, typed the same:
its constructor and ``from_url`` have the async ones' parameters (a test compares them, so
they cannot drift), and mypy (``--strict``, with ``warn_unused_ignores``, run over this file
in CI) holds each ``type: ignore`` below: it must still mark an error, so a misspelt or
mistyped setting is caught before the code runs."""

from __future__ import annotations

import inspect

import pytest

from ratelimit import ConfigurationError, MemoryBackend, Settings
from ratelimit import RateLimit as AsyncRateLimit
from ratelimit.sync import RateLimit


@pytest.mark.parametrize("method", ["__init__", "from_url"])
def test_the_sync_limiter_takes_the_async_one_s_parameters(method: str) -> None:
    def parameters(cls: type) -> list[tuple[str, object, object, object]]:
        signature = inspect.signature(getattr(cls, method))
        return [(p.name, p.kind, p.annotation, p.default) for p in signature.parameters.values()]

    assert parameters(RateLimit) == parameters(AsyncRateLimit)


def test_a_type_checker_catches_a_misspelt_setting() -> None:
    with pytest.raises(TypeError, match="algoritm"):
        RateLimit(MemoryBackend(), algoritm="gcra")  # type: ignore[call-arg]


def test_a_type_checker_catches_a_setting_of_the_wrong_type() -> None:
    with pytest.raises((TypeError, ConfigurationError), match="denial_cache"):
        RateLimit(MemoryBackend(), denial_cache="10")  # type: ignore[arg-type]
    with pytest.raises((TypeError, ConfigurationError), match="denial_cache"):
        RateLimit.from_url("memory://", denial_cache="10")  # type: ignore[arg-type]
    with pytest.raises((TypeError, ConfigurationError), match="shadow"):
        RateLimit.from_url("memory://", shadow="yes")  # type: ignore[arg-type]


def test_from_url_passes_the_settings_given_and_only_those() -> None:
    with RateLimit.from_url("memory://", "shop", algorithm="gcra", shadow=True) as rl:
        assert (rl.namespace, rl.algorithm, rl.settings.shadow) == ("shop", "gcra", True)
        assert rl.settings.on_error == "allow"  # not given: the default
    made = Settings(on_error="deny", algorithm="fixed-window")
    with RateLimit.from_url("memory://", settings=made, denial_cache=5) as rl:
        assert rl.settings == made.replace(denial_cache=5)  # only what was given replaces
