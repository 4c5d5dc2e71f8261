"""The one mapping of redis-py's errors into the package's tree (backends/redis/errors.py)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError, ResponseError

from ratelimit.backends.redis.errors import backend_error, mapped
from ratelimit.errors import BackendError, LockTimeoutError
from tests.redis_server import free_port


@pytest.mark.parametrize(
    ("raised", "says"),
    [
        (ResponseError("WRONGTYPE"), "redis failed to reset key 'k': WRONGTYPE"),
        (ConnectionError("gone"), "redis failed to reset key 'k': gone"),
        (ConnectionResetError("reset by peer"), "redis failed to reset key 'k': reset by peer"),
        (TimeoutError(), "redis did not answer within 0.25 s to reset key 'k'"),
    ],
)
def test_redis_failures_become_backend_errors(raised: Exception, says: str) -> None:
    with pytest.raises(BackendError) as caught, mapped("to reset key 'k'", 0.25):
        raise raised
    assert str(caught.value) == says
    assert caught.value.__cause__ is raised


@pytest.mark.parametrize(
    "raised", [LockTimeoutError("lock", 1.0), ValueError("a bug"), KeyError("k")]
)
def test_the_packages_own_errors_and_bugs_pass_through(raised: Exception) -> None:
    with pytest.raises(type(raised)) as caught, mapped("to decide key 'k'", 0.25):
        raise raised
    assert caught.value is raised


def test_each_caller_gets_its_own_error() -> None:
    cause = ResponseError("WRONGTYPE")
    first, second = (backend_error(cause, "to decide key 'k'", None) for _ in range(2))
    assert first is not second
    assert first.__cause__ is cause is second.__cause__


async def test_valkey_clients_errors_follow_on_error_as_redis_pys_do() -> None:
    """A valkey-py client to a port nobody listens on: its own ConnectionError becomes a
    BackendError, which the failure policy answers."""
    import valkey.asyncio as aiovalkey

    from ratelimit import RateLimit

    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = aiovalkey.Valkey.from_url(dead)
    try:
        decision = await RateLimit(client, "vk").limit("1/s").decide()
        assert decision.allowed
        assert decision.degraded
        with pytest.raises(BackendError, match="redis failed"):
            await RateLimit(client, "vk", on_error="raise").limit("1/s").decide()
        with pytest.raises(BackendError):
            await RateLimit(client, "vk", on_error="raise", use_scripts=False).limit("1/s").decide()
    finally:
        await client.aclose()
