"""The direct path of the synchronous API: a plain decision made in the calling thread.

Handing a call to the limiter's loop (:mod:`ratelimit.sync.portal`) costs two thread
wake-ups: the loop's, then the caller's. A plain decision needs neither where the store can
be asked from any thread: ``memory://`` (its ``decide`` takes a thread lock and never
awaits) and the Redis script engine on a plain ``redis.asyncio.Redis`` (the same ``EVALSHA``
of the same script, sent by a synchronous redis-py connection of the same address, options
and credentials: :mod:`ratelimit.backends.redis.script.blocking`). The decision is still the
async pipeline's own:
:meth:`Decider.decide` (denial cache, failure policy, shadow, the backend's own reply
parsing) run to its end at once in the calling thread, on a twin of the limiter's decider
whose backend answers without suspending.

The decorator's decisions (:meth:`DirectPath.admit`) and the front ends' door
(:meth:`DirectPath.decide`, without ``within=`` or an override) take it. A decorated
function's plain calls go shorter still, as the async decorator's do: their plan comes
from the limit's table of plans (:func:`ratelimit.front.direct.direct_path`), and the store
admits it without a decision being built (``memory://``'s own admission, or the Redis
script engine's ``admits``: :meth:`DirectPath.admission`); only a refusal is read whole,
and under ``wait=`` waited out on the loop. What is not a plain decision goes to the loop
as before (they answer ``None``): a limiter with hooks, ``settle=``, ``wait=`` (on
:meth:`DirectPath.admit`'s way), a cost callable, rules chosen per call, selectors that
are not the call's own arguments (callables, a selector object, keywords: they run on the
loop, in the caller's context), an override in force for the key (or overrides not read
yet, or a key the store has not been told of), background counting, an outage under way
(the loop's decisions end it), a closed limiter, and every store but those two (Cluster,
Sentinel, the command engine, ``sync_rate``, PostgreSQL). Anything set later (an override,
hooks) is looked at on every call, so it takes effect at the next one.
A failure of the store on the direct path is answered by the same failure policy
(``on_error``) in the calling thread, as on the loop.

The limiter's denial cache is shared by the loop and the calling threads, so the sync API
gives it a lock (:class:`LockedDenials`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, cast

from ratelimit.backends.memory.backend import MemoryBackend
from ratelimit.backends.redis.script.blocking import blocking_engine
from ratelimit.backends.redis.script.engine import RedisScriptBackend
from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.core.plan import CompiledTree, Cost, Plan
from ratelimit.core.selectors import CallSite, resolved_now
from ratelimit.front.direct import asker
from ratelimit.front.limit import Limit
from ratelimit.front.limiter import RateLimit as AsyncRateLimit
from ratelimit.pipeline.decider import CallKey, Decider, new_call_key
from ratelimit.pipeline.denials import Call, DenialCache

T = TypeVar("T")


class LockedDenials(DenialCache):
    """The denial cache, safe to use from the loop and the calling threads at once."""

    def __init__(self, cache: DenialCache) -> None:
        super().__init__(cache.size, cache._clock)
        self._lock = threading.Lock()

    def get(self, call: Call) -> Decision | None:
        if not self._until:  # most calls: nothing refused, nothing to lock
            return None
        with self._lock:
            return super().get(call)

    def forget(self, namespace: str, key: str) -> None:
        with self._lock:
            super().forget(namespace, key)

    def remember(self, call: Call, decision: Decision) -> None:
        with self._lock:
            super().remember(call, decision)

    def clear(self) -> None:
        with self._lock:
            super().clear()


class ToTheLoop(Exception):
    """An admission of the direct path (:meth:`DirectPath.admission`) while an outage is
    under way: the call goes to the loop, whose decisions end it."""


Admission = Callable[[Plan], "Decision | None"]
"""``admit(plan)``: ``None`` when the store admitted (and recorded) ``plan``, else its
decision (a refusal, or the failure policy's answer)."""


class DirectPath:
    """Plain decisions of ``limiter`` in the calling thread (see the module's docstring).
    Made by :func:`direct_path`, once per async limiter (a forked child makes its own)."""

    def __init__(
        self, limiter: AsyncRateLimit, decider: Decider, disconnect: Callable[[], object] | None
    ) -> None:
        self._main: Decider = limiter._decider
        self._shadow = limiter.settings.shadow
        self._decider = decider
        self.close: Callable[[], object] = lambda: None
        """Close the synchronous client's connections: at ``close()``, or when this path
        is collected with its limiter (then no call is left to use them)."""
        if disconnect is not None:
            self.close = weakref.finalize(self, disconnect)

    def admit(self, limit: Limit, key: str, site: CallSite) -> Decision | None:
        """What ``limit._admit(key, site)`` gives (a decision, or ``RateLimitExceeded``),
        decided here; ``None`` when the call is not a plain decision (the loop decides)."""
        main = self._main
        registration = limit._registration
        if (
            registration is None  # the first call registers it, on the loop
            or main.closed
            or main.hooks
            or main.policy.failing
            or limit._settle is not None
            or limit._count_when is not None
            or limit._wait
            or not limit._cost.fixed
            or limit._penalizer is not None
        ):
            return None
        compiled = registration.compiled
        if type(compiled) is not CompiledTree:
            return None
        values: tuple[str | None, ...] = ()
        if compiled.selectors:
            now = resolved_now(compiled.selectors, registration.sources, site)
            if now is None:
                return None
            values = now
        overrides = main.overrides
        if overrides is not None and not overrides.quiet(key):
            return None
        call = limit._call_key(key, compiled, values, limit._cost.of(compiled, main.algorithm))
        decision = run_now(self._decider.decide(call, True, limit._shadow))
        if not decision.allowed and not decision.shadow:
            raise RateLimitExceeded(decision)
        return decision

    def admission(self) -> Admission | None:
        """The store's admission of a plan in the calling thread, for the decorator's plain
        calls (:func:`ratelimit.sync.limits._direct_parts`), where the store answers an
        admission without building a decision (the Redis script engine's ``admits``, under
        the failure policy: :func:`~ratelimit.front.direct.asker`); ``None`` elsewhere
        (``memory://``'s own admission is the limit's). Raises :class:`ToTheLoop` while
        an outage is under way."""
        asked = asker(self._decider)
        if asked == self._decider.ask:
            return None
        ask = cast("Callable[[Plan], Coroutine[Any, Any, Decision | None]]", asked)
        policy = self._main.policy

        def admit(plan: Plan) -> Decision | None:
            if policy.outage_started is not None:
                raise ToTheLoop
            return run_now(ask(plan))

        return admit

    def decide(
        self,
        compiled: CompiledTree,
        key: str,
        values: tuple[str | None, ...],
        cost: Cost | Mapping[str, float],
        shadow: bool | None,
        record: bool,
    ) -> Decision | None:
        """What the front ends' door (``RateLimit.decide``) gives, decided here; ``None``
        when it is not a plain decision (the loop decides)."""
        main = self._main
        if main.closed or main.hooks or main.policy.failing or isinstance(cost, Mapping):
            return None
        call = new_call_key(CallKey, (compiled, main.namespace, key, values, cost, main.algorithm))
        shadow = self._shadow if shadow is None else shadow
        return run_now(self._decider.decide(call, record, shadow))


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end now, in this thread; it must never suspend."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a decision of the direct path suspended")  # pragma: no cover


def direct_path(limiter: AsyncRateLimit) -> DirectPath | None:
    """The direct path of a limiter just made (before its first decision), or ``None``
    where its store cannot be asked from the calling thread. Gives the limiter a
    :class:`LockedDenials` in place of its denial cache."""
    main = limiter._decider
    backend = main.backend
    if main.background is not None:
        return None
    disconnect = None
    if type(backend) is MemoryBackend:
        direct: object = backend  # thread-safe: a lock, and no await
    elif type(backend) is RedisScriptBackend:
        made = blocking_engine(backend)
        if made is None:
            return None
        direct, disconnect = made
    else:
        return None
    denials = LockedDenials(main.denials)
    limiter._denials = main.denials = denials
    decider = Decider(
        main.namespace,
        main.algorithm,
        direct,  # type: ignore[arg-type]
        main.policy,
        denials,
        main.hooks,
        None,
        main.overrides,
    )
    return DirectPath(limiter, decider, disconnect)
