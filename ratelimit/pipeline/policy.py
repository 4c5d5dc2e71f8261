"""What a decision does when the storage fails: ``on_error="allow" | "deny" | "raise" |
"local"``.

``allow`` (default, fail-open, as nginx limiters and Envoy do) admits the call; ``deny``
refuses it (``retry_after`` of :data:`DENY_RETRY_AFTER`); ``raise`` raises the
``BackendError``; the decision says ``degraded=True``. Its hit may or may not have been
counted: a script that reached Redis before the connection dropped or the deadline passed
may have run there (which only refuses later calls sooner). Only ``BackendError``
(Redis unreachable, timed out, or answering with an error) is a failure.

The command engine's lock held past ``lock_timeout`` (``LockTimeoutError``) is contention
on a store that answers, not a failure: admitting would let calls past the limit, so it
is refused whatever ``on_error`` says (``allowed=False, degraded=True``, ``retry_after``
the seconds until the holder's lock ends by its ttl, else :data:`DENY_RETRY_AFTER`), or
raised under ``"raise"``. Nothing was counted.

``local`` decides the call in-process on this process's share of each limit until the
storage answers again (:mod:`ratelimit.pipeline.fallback`, which :meth:`FailurePolicy.failed_plan`
and :meth:`FailurePolicy.decide` reach only on a failure or while an outage is under way).

Outages are logged on the ``ratelimit`` logger without flooding it: one warning when one
starts, one per minute while it lasts, and one when the storage answers again. Lock
timeouts are logged apart, as contention, never as an outage: one warning at the first,
then at most one a minute with how many calls were refused since.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ratelimit.backends import Backend
from ratelimit.backends.base import SettleStore, SlotStore
from ratelimit.core.checks import check_on_error
from ratelimit.core.decision import Decision, LocalSlotRefusal, LockRefusal
from ratelimit.core.plan import Plan
from ratelimit.core.settling import Settlement
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import BackendError, LockTimeoutError
from ratelimit.pipeline.fallback import LocalFallback
from ratelimit.pipeline.hooks import Hooks

DENY_RETRY_AFTER = 1.0
SUMMARY_EVERY = 60.0

logger = logging.getLogger("ratelimit")

_VERBS = {
    "allow": "admitting",
    "deny": "refusing",
    "raise": "raising for",
    "local": "deciding in-process on each limit's local share of",
}


class FailurePolicy:
    """Runs decisions on a backend and applies ``on_error`` when the backend fails."""

    def __init__(
        self, on_error: str = "allow", hooks: Hooks | None = None, local_share: float = 1.0
    ) -> None:
        check_on_error(on_error)
        self.on_error = on_error
        self.local = LocalFallback(local_share) if on_error == "local" else None
        """``on_error="local"``'s store and probe (:mod:`.fallback`), else ``None``."""
        self._hooks = hooks or Hooks(())
        self.outage_started: float | None = None
        """When the outage under way began (``time.monotonic``), or ``None``."""
        self._last_summary = 0.0
        self._degraded = 0
        self._degraded_since_summary = 0
        self._lock_logged_at: float | None = None
        self._lock_timeouts_since_log = 0
        self._settle_logged_at: float | None = None
        self._settles_lost = 0
        self._last_error: BackendError | None = None

    async def decide(self, backend: Backend, plan: Plan) -> Decision:
        """``backend``'s decision of ``plan``, or this policy's when it fails; under
        ``"local"`` while an outage is under way, the local one at once (and a probe)."""
        if self.outage_started is not None:  # rarely
            return await self._decide_failing(backend, plan)
        try:
            return await backend.decide(plan)
        except BackendError as exc:
            return await self.failed_plan(exc, plan)
        except LockTimeoutError as exc:
            return self.lock_timed_out(exc, plan.key)

    async def _decide_failing(self, backend: Backend, plan: Plan) -> Decision:
        """:meth:`decide` while an outage is under way: under ``"local"`` decided locally
        at once (the probe asks the store); else the store is asked, and its answer ends
        the outage."""
        local = self.local
        if local is not None:
            local.maybe_probe(self.answered)
            self._failed(None)
            return await local.decide(plan)
        try:
            decision = await backend.decide(plan)
        except BackendError as exc:
            return await self.failed_plan(exc, plan)
        except LockTimeoutError as exc:
            return self.lock_timed_out(exc, plan.key)
        self.answered()
        return decision

    async def settle(self, backend: SettleStore, settlement: Settlement) -> bool:
        """Record ``settlement``; ``False`` when the storage failed (or its lock stayed
        held) and the settle was lost, which is logged as any failure is (raised under
        ``"raise"``). The call it settles ran already: nothing is refused."""
        try:
            await backend.settle(settlement)
        except (BackendError, LockTimeoutError) as exc:
            return self.settled(settlement, exc)
        return self.settled(settlement, None)

    def settled(self, settlement: Settlement, error: BaseException | None) -> bool:
        """What :meth:`settle` answers once the store's write of ``settlement`` ended with
        ``error`` (``None``: recorded); an error other than a failure is raised."""
        if error is None:
            self.answered()
            return True
        if not isinstance(error, (BackendError, LockTimeoutError)) or self.on_error == "raise":
            raise error
        now = time.monotonic()
        self._settles_lost += 1
        self._hooks.store_event("store_failed")
        if self._settle_logged_at is None or now - self._settle_logged_at >= SUMMARY_EVERY:
            logger.warning(
                "ratelimit: %d settles lost since the last such warning (the last of key "
                "%r: %s); their reservations stand as counted",
                self._settles_lost,
                settlement.plan.key,
                error,
            )
            self._settle_logged_at = now
            self._settles_lost = 0
        return False

    async def failed_plan(self, exc: BackendError, plan: Plan) -> Decision:
        """The decision ``on_error`` makes for ``plan`` when the storage failed with
        ``exc``: :meth:`failed`'s, or under ``"local"`` the local one."""
        if self.local is None:
            return self.failed(exc, plan.key)
        self._failed(exc)
        self.local.maybe_probe(self.answered)
        return await self.local.decide(plan)

    def failed(self, exc: BackendError, key: str) -> Decision:
        """The decision ``on_error`` makes for a call of ``key`` when the storage failed
        with ``exc`` (which it raises under ``"raise"``); under ``"local"``, whose
        decisions need the call's plan (:meth:`failed_plan`), the caller decides."""
        if self.on_error == "raise":
            raise exc
        self._failed(exc)
        allowed = self.on_error == "allow"
        return Decision(
            allowed,
            0.0 if allowed else DENY_RETRY_AFTER,
            None,
            None if allowed else 0,
            key,
            degraded=True,
        )

    async def take_slots(
        self, store: SlotStore, claim: SlotClaim
    ) -> tuple[bool, tuple[int, ...], bool]:
        """``claim``'s slots taken at ``store``: whether taken, the holders per identifier,
        and whether the take was degraded. Under ``"local"``, on a failure or while an
        outage is under way, they are taken on the local store (:mod:`ratelimit.pipeline.fallback`),
        and a take that failed at ``store`` is revoked there."""
        local = self.local
        if local is None or self.outage_started is None:
            try:
                taken, held = await store.acquire_slots(claim)
            except BackendError as exc:
                if local is None:
                    raise
                self._failed(exc)
                local.spawn_quietly(store.release_slots(claim, revoke=True))
            else:
                return taken, held, False
        else:
            self._failed(None)
        local.maybe_probe(self.answered)
        taken, held = await local.take_slots(claim)
        return taken, held, True

    @staticmethod
    def taken_locally(decision: Decision) -> Decision:
        """A slot take decided on ``on_error="local"``'s store: ``degraded``, and when
        refused a :class:`LocalSlotRefusal` (the local share is full: the limit refused,
        not the storage)."""
        if decision.allowed:
            return dataclasses.replace(decision, degraded=True)
        return LocalSlotRefusal(
            False, decision.retry_after, None, decision.remaining, decision.key, degraded=True
        )

    def holding(self, claim: SlotClaim, revoke: bool) -> LocalFallback | None:
        """The local store of ``on_error="local"`` when ``claim``'s slots were taken there
        (and it is given back, not revoked at the store after a failed take), else
        ``None``: the store."""
        local = self.local
        return local if local is not None and not revoke and local.holds(claim) else None

    def lock_timed_out(self, exc: LockTimeoutError, key: str) -> Decision:
        """The decision for a call of ``key`` whose lock stayed held past ``lock_timeout``:
        a refusal (``degraded=True``) under ``"allow"`` and ``"deny"`` alike, ``exc``
        raised under ``"raise"``. Not an outage."""
        if self.on_error == "raise":
            raise exc
        now = time.monotonic()
        self._lock_timeouts_since_log += 1
        if self._lock_logged_at is None or now - self._lock_logged_at >= SUMMARY_EVERY:
            logger.warning(
                "ratelimit: %s; refusing such calls (lock contention on a storage that "
                "answers, not an outage); %d refused since the last such warning",
                exc,
                self._lock_timeouts_since_log,
            )
            self._lock_logged_at = now
            self._lock_timeouts_since_log = 0
        wait = exc.retry_after if exc.retry_after else DENY_RETRY_AFTER
        return LockRefusal(False, wait, None, 0, key, degraded=True)

    def answered(self) -> None:
        """The storage answered: an outage, if one was under way, is over."""
        if self.outage_started is not None:
            self._recovered()

    @property
    def failing(self) -> bool:
        """Whether an outage is under way: a decision failed, and the storage has not
        answered since."""
        return self.outage_started is not None

    def _failed(self, exc: BackendError | None) -> None:
        """Count a degraded decision: ``exc``, the store's failure (``None``: decided
        locally without asking the store, under ``"local"``); log an outage's start and a
        summary a minute."""
        now = time.monotonic()
        self._degraded += 1
        self._degraded_since_summary += 1
        if exc is None:
            exc = self._last_error
        else:
            self._last_error = exc
            self._hooks.store_event("store_failed")
        verb = _VERBS[self.on_error]
        if self.outage_started is None:
            self.outage_started = self._last_summary = now
            self._degraded_since_summary = 0
            self._hooks.store_event("outage_started")
            logger.warning("ratelimit: storage failed, %s calls until it answers: %s", verb, exc)
        elif now - self._last_summary >= SUMMARY_EVERY:
            logger.warning(
                "ratelimit: storage still failing after %.0f s; %d more calls %s: %s",
                now - self.outage_started,
                self._degraded_since_summary,
                "decided in-process" if self.local else verb.replace("ing", "ed"),
                exc,
            )
            self._last_summary = now
            self._degraded_since_summary = 0

    def _recovered(self) -> None:
        assert self.outage_started is not None
        lasted = time.monotonic() - self.outage_started
        logger.warning(
            "ratelimit: storage answers again after %.1f s; %d decisions were degraded",
            lasted,
            self._degraded,
        )
        self._hooks.store_event("outage_ended", lasted)
        self.outage_started = None
        self._degraded = 0
