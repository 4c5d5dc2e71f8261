"""``on_error="local"`` in the rate-limit service (issue 39, part 1): the environment's
``RATELIMIT_ON_ERROR=local`` and ``RATELIMIT_LOCAL_SHARE``, checked at start, and local
decisions answered as any decision (OK, then OVER_LIMIT with its headers)."""

from __future__ import annotations

import pytest

from ratelimit import RateLimit
from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig
from tests.conftest import FakeClock
from tests.test_local_fallback import Flaky
from tests.test_service_headers import OK, OVER, handlers, headers, request

pytestmark = pytest.mark.timeout(30)


def test_the_environment_gives_the_policy_and_its_share() -> None:
    config = ServiceConfig.from_env(
        {"RATELIMIT_ON_ERROR": "local", "RATELIMIT_LOCAL_SHARE": "0.25"}
    )
    assert (config.on_error, config.local_share) == ("local", 0.25)
    assert ServiceConfig.from_env({"RATELIMIT_ON_ERROR": "local"}).local_share == 1.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RATELIMIT_LOCAL_SHARE": "0.5"}, "applies only to RATELIMIT_ON_ERROR=local"),
        (
            {"RATELIMIT_ON_ERROR": "deny", "RATELIMIT_LOCAL_SHARE": "0.5"},
            "applies only to RATELIMIT_ON_ERROR=local",
        ),
        (
            {"RATELIMIT_ON_ERROR": "local", "RATELIMIT_LOCAL_SHARE": "half"},
            "RATELIMIT_LOCAL_SHARE must be a number with 0 < share <= 1",
        ),
        (
            {"RATELIMIT_ON_ERROR": "local", "RATELIMIT_LOCAL_SHARE": "2"},
            "RATELIMIT_LOCAL_SHARE must be a number with 0 < share <= 1",
        ),
        ({"RATELIMIT_ON_ERROR": "locally"}, "'allow'.*'deny'.*'local'"),
    ],
)
def test_a_bad_environment_stops_the_service(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ServiceConfig.from_env(env)


async def test_local_decisions_answer_ok_then_over_limit() -> None:
    store = Flaky(FakeClock())
    rl = RateLimit(store, on_error="local", local_share=0.5)
    service = handlers(rl)  # the descriptor "user" is limited to 3/h: 1 locally
    asked = request((("user", "u"),))
    store.down = True
    first = await service.should_rate_limit(asked)
    second = await service.should_rate_limit(asked)
    assert first.overall_code == OK
    assert second.overall_code == OVER
    assert int(headers(second)["retry-after"]) > 3000  # the local share's own wait
    await rl.aclose()
