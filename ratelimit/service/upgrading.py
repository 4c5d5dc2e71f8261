"""What the service says at start to those upgrading from a version that kept everything
under the namespace ``"ratelimit"`` (the service's old default; the library's, and now the
service's, is ``""``).

When ``RATELIMIT_NAMESPACE`` is not set, the service reads the overrides of both namespaces
once, at start: live overrides under ``"ratelimit"`` and none under ``""`` are those an
older service kept, which this one would no longer apply, so it logs one warning naming the
variable that keeps them. Counters left there are not looked for (listing them would scan
the store); they only start afresh. A store that keeps no overrides, or that fails to
answer within the service's timeout, is not asked again: the check never delays or stops
the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from ratelimit.backends.base import OverrideStore, clock_of, override_store
from ratelimit.errors import RateLimitError
from ratelimit.front.limiter import RateLimit
from ratelimit.overrides.cache import decode
from ratelimit.service.config import ServiceConfig
from ratelimit.service.observing import WORKER

logger = logging.getLogger("ratelimit.service")

OLD_NAMESPACE = "ratelimit"
"""The service's default namespace before it became the library's ``""``."""


async def warn_of_old_namespace(limiter: RateLimit, config: ServiceConfig) -> str | None:
    """Log (and return) the warning for overrides left under :data:`OLD_NAMESPACE`, if
    ``RATELIMIT_NAMESPACE`` is unset and the store keeps some there and none under the
    namespace in use; ``None`` otherwise. One worker of ``--workers`` says it, not each."""
    store = override_store(limiter.storage)
    wall = clock_of(limiter.storage) or time.time  # the limiter's overrides' own
    if config.namespace_given or store is None or os.environ.get(WORKER, "0") != "0":
        return None
    try:
        old = await asyncio.wait_for(_live(store, OLD_NAMESPACE, wall), config.timeout)
        if not old:
            return None
        new = await asyncio.wait_for(_live(store, config.namespace, wall), config.timeout)
        if new:
            return None
    except (RateLimitError, TimeoutError) as exc:
        logger.debug("ratelimit: overrides under the old namespace not looked for: %s", exc)
        return None
    message = (
        f"ratelimit: {old} override{'' if old == 1 else 's'} kept under namespace "
        f"{OLD_NAMESPACE!r}, the service's default before it became the library's "
        f"{config.namespace!r}, and none under {config.namespace!r}: set "
        f"RATELIMIT_NAMESPACE={OLD_NAMESPACE} to keep applying them (and counting on the "
        "counters kept there), or RATELIMIT_NAMESPACE= (empty) to start afresh and not be "
        "warned again"
    )
    logger.warning("%s", message)
    return message


async def _live(store: OverrideStore, namespace: str, wall: Callable[[], float]) -> int:
    """How many live overrides ``store`` keeps under ``namespace`` (keys processes
    announced there are not overrides)."""
    _, table = await store.overrides_load(namespace)
    now = wall()
    found = (decode(identity, record) for identity, record in table.items() if identity[:1] == "[")
    return sum(1 for override in found if override is not None and override.live(now))
