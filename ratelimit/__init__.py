"""Distributed rate limiting for asyncio over Redis.

Example::

    from ratelimit import RateLimit

    rl = RateLimit.from_url("redis://localhost:6379", namespace="shop")

    @rl.limit("apikey:100/h & (10/s | 15/m)", apikey=get_api_key)
    async def search(q: str) -> list[str]: ...
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ratelimit.backends import Backend as Backend
from ratelimit.backends import MemoryBackend as MemoryBackend
from ratelimit.core.decision import Decision as Decision
from ratelimit.core.decision import RateLimitExceeded as RateLimitExceeded
from ratelimit.core.decision import RuleState as RuleState
from ratelimit.core.lazy import lazily as _lazily
from ratelimit.core.settings import Settings as Settings
from ratelimit.errors import BackendError as BackendError
from ratelimit.errors import ConfigurationError as ConfigurationError
from ratelimit.errors import EventLoopError as EventLoopError
from ratelimit.errors import LimiterClosedError as LimiterClosedError
from ratelimit.errors import LockTimeoutError as LockTimeoutError
from ratelimit.errors import RateLimitError as RateLimitError
from ratelimit.errors import RuleConflictError as RuleConflictError
from ratelimit.errors import RuleSyntaxError as RuleSyntaxError
from ratelimit.errors import SelectorNotFoundError as SelectorNotFoundError
from ratelimit.errors import SettleError as SettleError
from ratelimit.errors import UnknownKeyError as UnknownKeyError
from ratelimit.front.concurrency import Concurrency as Concurrency
from ratelimit.front.concurrency import ConcurrencyLimitExceeded as ConcurrencyLimitExceeded
from ratelimit.front.limit import Limit as Limit
from ratelimit.front.limiter import RateLimit as RateLimit
from ratelimit.overrides.cache import Override as Override
from ratelimit.overrides.handle import Overrides as Overrides
from ratelimit.rules.tree import And as And
from ratelimit.rules.tree import Or as Or
from ratelimit.rules.tree import Rule as Rule

if _TYPE_CHECKING:
    from ratelimit.backends.redis import RedisCommandBackend as RedisCommandBackend
    from ratelimit.backends.redis import RedisScriptBackend as RedisScriptBackend


__getattr__ = _lazily(  # the Redis engines, with redis-py, when first named
    __name__,
    {
        "RedisCommandBackend": "ratelimit.backends.redis.command.engine",
        "RedisScriptBackend": "ratelimit.backends.redis.script.engine",
    },
)


__all__ = [
    "And",
    "Backend",
    "BackendError",
    "Concurrency",
    "ConcurrencyLimitExceeded",
    "ConfigurationError",
    "Decision",
    "EventLoopError",
    "Limit",
    "LimiterClosedError",
    "LockTimeoutError",
    "MemoryBackend",
    "Or",
    "Override",
    "Overrides",
    "RateLimit",
    "RateLimitError",
    "RateLimitExceeded",
    "RedisCommandBackend",
    "RedisScriptBackend",
    "Rule",
    "RuleConflictError",
    "RuleState",
    "RuleSyntaxError",
    "SelectorNotFoundError",
    "Settings",
    "SettleError",
    "UnknownKeyError",
]
