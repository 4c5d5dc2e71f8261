"""What a backend is: an object that decides plans (:class:`Backend`, a ``Protocol``, not a
registry), what else it may say it can do (its capabilities, listed on :class:`Backend`),
and the functions the core reads those through, each with the default for a backend that
does not say.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeGuard, runtime_checkable

from ratelimit.algorithms import Algorithm
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, CounterUpdate, Identifier, Plan
from ratelimit.core.settling import Settlement
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import ConfigurationError

Clock = Callable[[], float]
"""A clock returns seconds as a float; only differences between readings matter."""


@runtime_checkable
class Backend(Protocol):
    """Decides a plan atomically: counts, evaluates the tree, records the hit if allowed.

    Besides these methods, a backend may declare its capabilities. Every backend of this
    package declares ``algorithms``, ``clock`` and ``holds_slots``; a backend of yours that
    lacks one gets the default named here, through the function the core reads it with:

    - ``algorithms``: the names of the algorithms it decides (:func:`check_supported`;
      default: any);
    - ``clock``: the clock it decides on, when one was injected (:func:`clock_of`; default
      ``None``: the store's own), which the denial cache then follows;
    - ``holds_slots``: whether it holds concurrency slots (:func:`holds_slots`; default:
      whether it has :class:`SlotStore`'s methods, which it needs in any case);
    - ``sync_counters`` (:class:`CounterSync`): a store ``sync_rate`` can sync local
      counters with (the Redis script engine, Postgres);
    - ``setup`` (:class:`SetUpStore`): a store to prepare before it decides (Postgres);
    - ``settle`` (:class:`SettleStore`): it records what calls really cost after they ran
      (``settle=``); every backend of this package does;
    - ``overrides_*`` (:class:`OverrideStore`): it keeps the rules overridden at run time
      (``rl.overrides``); every backend of this package does;
    - ``schemes``: the storage URL schemes that open it (``RateLimit.from_url``: see
      :mod:`ratelimit.backends.urls`; a backend of yours is passed, not opened, and needs
      none).

    Being closed is recorded twice, each record the truth for its own object.
    ``RateLimit``'s (``Decider.closed``) answers for the limiter: every call it takes after
    its ``aclose`` raises ``LimiterClosedError``, also those it would answer without its
    backend (a refusal in the denial cache, a call counted in the background), whatever
    the backend keeps. A backend's answers for the backend, which may be used, and closed,
    without a limiter: after :meth:`aclose`, each call of a backend of this package that
    would reach its store raises ``LimiterClosedError``, and closing it again does nothing.
    The limiter's slot give-backs and renewals, which go on while it closes (so that the
    give-backs finish before its backend closes), meet the backend's record only.
    """

    async def decide(self, plan: Plan) -> Decision:
        """Decide one call; record its hit on every identifier only if it is allowed."""
        ...

    async def reset(self, plan: Plan) -> None:
        """Forget every hit counted on the identifiers of ``plan`` (logs and counters)."""
        ...

    async def update_counter(self, update: CounterUpdate) -> float:
        """Kong's counter API: add to a window counter, return the sliding rate after it."""
        ...

    async def aclose(self) -> None:
        """Release what the backend opened; idempotent."""
        ...


@runtime_checkable
class SlotStore(Protocol):
    """Holds concurrency slots (``rl.concurrency``): each method is atomic over every
    identifier of the claim, on the store's clock."""

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        """Take a slot on every identifier of ``claim`` if each has one free (holders whose
        lease ended are dropped first), else take none. Returns whether they were taken
        and, per identifier, how many live holders it had before."""
        ...

    async def renew_slots(self, claim: SlotClaim) -> bool:
        """Extend ``claim``'s leases by its lease from now; ``False`` when a slot was lost
        (its lease ended and another holder came)."""
        ...

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        """Give ``claim``'s slots back (nothing happens for slots no longer held).

        ``revoke``: the claim's take may still reach the store (it failed or its caller
        left before the answer, and a give-back on another connection may overtake it);
        for one lease, a take of ``claim`` that arrives takes nothing."""
        ...


class Push(NamedTuple):
    """One identifier's local diffs for ``sync_counters``."""

    identifier: Identifier
    entries: Sequence[tuple[int, int, float]]
    """(window size us, window index, diff)."""
    spreads: bool = False
    """Whether it may be kept under a hash tag of its own (the tree that counted on it was
    not compiled pinned: :attr:`~ratelimit.core.plan.CompiledTree.pinned`): a store that
    keeps identifiers apart (a Redis engine with ``spread``) writes it where decisions
    would; other stores ignore it."""


Totals = dict[int, dict[int, float]]
"""One identifier's totals from ``sync_counters``: per window size, per window index, count."""


@runtime_checkable
class CounterSync(Protocol):
    """Where ``sync_rate > 0`` syncs local window counters (the Redis script engine,
    Postgres): :class:`~ratelimit.backends.synced.SyncedBackend` decides in-process and
    calls these."""

    async def sync_counters(
        self, pushes: Sequence[Push]
    ) -> tuple[int | None, list[Totals | Exception]]:
        """Push local diffs and fetch totals for many identifiers in one round trip.
        Returns the store's time (us; ``None`` if no push succeeded) and, per push, its
        totals or the error of its push (its diffs were then not applied)."""
        ...

    async def reset(self, plan: Plan) -> None:
        """Forget every count of ``plan``'s identifiers."""
        ...

    async def aclose(self) -> None:
        """Release what the store opened."""
        ...


@runtime_checkable
class SettleStore(Protocol):
    """A store that settles calls after they ran (``limit(..., settle=...)``,
    ``Limit.settle``): see :mod:`ratelimit.core.settling`."""

    async def settle(self, settlement: Settlement) -> None:
        """Record ``settlement`` on every identifier of its plan, in one atomic step: each
        leaf's refund taken back from what the reservation recorded, each excess recorded
        now, past the limit."""
        ...


ANNOUNCED_FOR = 7 * 86_400
"""Seconds an announced key stays in a store's table without being announced again (a
process announces each of its keys again every day): pruned with expired overrides. Three
places must agree: this, :func:`announced_before` (memory, Redis) and ``schema.sql``'s
``ratelimit_override_prune`` (604800); ``tests/test_override_promises.py``'s pruning test
holds them together on every store."""


def announced_before(announced: str, horizon: float) -> bool:
    """Whether an announcement's record (its seconds by the store's clock; empty where an
    older version kept none) is older than ``horizon``: an undated one is."""
    try:
        return float(announced) <= horizon
    except ValueError:
        return True


def stamped(record: str, version: int) -> str:
    """``record`` (an override's, a JSON object) with the store's order in it: the
    namespace's ``version`` its write made (:meth:`OverrideStore.overrides_write`). A
    record that is no JSON object is kept as it is (reading it reports it)."""
    try:
        fields = json.loads(record)
    except ValueError:
        return record
    if not isinstance(fields, dict):
        return record
    fields["version"] = version
    return json.dumps(fields, ensure_ascii=False)


@runtime_checkable
class OverrideStore(Protocol):
    """A store that keeps overrides (``rl.overrides``, :mod:`ratelimit.overrides.cache`): per
    namespace, a version and a table from an override's identity to its record, which
    also holds the keys processes announced (identities ``key:<key>``, records empty).

    The store orders the overrides, never a writer's clock: each write makes the next
    version of the namespace, and the record read back carries it as ``"version"``
    (:func:`stamped`), so that of two overrides matching one call equally, the one whose
    write came last wins in every process. A record without one (written before the
    store kept it) ranks below every one with."""

    async def overrides_version(self, namespace: str) -> int:
        """The version of ``namespace``'s overrides: it changes with every write (0 for
        none ever written)."""
        ...

    async def overrides_load(self, namespace: str) -> tuple[int, dict[str, str]]:
        """The version and the whole table, read together."""
        ...

    async def overrides_write(
        self, namespace: str, identity: str, record: str | None, expires: float | None
    ) -> bool:
        """Keep ``record`` under ``identity`` (``None``: delete it), with when it expires
        (seconds since the epoch; ``None``: never), and make the namespace's next version,
        atomically: the record is read back :func:`stamped` with that version. Returns
        whether ``identity`` was there before."""
        ...

    async def overrides_announce(self, namespace: str, keys: Sequence[str]) -> None:
        """Record that a process limits ``keys`` now, by the store's clock (the record: its
        seconds; the version stays)."""
        ...

    async def overrides_prune(self, namespace: str, now: float) -> int:
        """Delete the overrides expired at ``now`` (seconds since the epoch), each only if
        still as it expired, and the keys not announced for :data:`ANNOUNCED_FOR` seconds
        by the store's clock; returns how many overrides."""
        ...


def check_settles(backend: object) -> None:
    """``backend`` settles calls (:class:`SettleStore`), or ``ConfigurationError``."""
    if not isinstance(backend, SettleStore):
        raise ConfigurationError(
            f"this storage ({type(backend).__name__}) cannot settle calls: it has no "
            "settle(settlement) method"
        )


def clock_us(clock: Clock) -> int:
    """Read a clock in whole microseconds."""
    return round(clock() * 1_000_000)


NOTHING_TO_SET_UP = "nothing to set up: this store keeps no schema"


@runtime_checkable
class SetUpStore(Protocol):
    """A store that must be prepared before it decides (a schema to put in place). It does
    so at first use by itself; ``setup`` does it now (``RateLimit.setup``)."""

    async def setup(self) -> str:
        """Prepare the store, or find it prepared (idempotent); return what was done, in
        words. ``BackendError`` when the store fails."""
        ...


def override_store(backend: object) -> OverrideStore | None:
    """Where ``backend`` keeps overrides: itself, else the store it syncs local counters
    with (``remote``: ``sync_rate``'s), else nowhere (``None``)."""
    for store in (backend, getattr(backend, "remote", None)):
        if isinstance(store, OverrideStore):
            return store
    return None


def clock_of(backend: object) -> Clock | None:
    """The clock ``backend`` decides on when one was injected, else ``None``."""
    clock: Clock | None = getattr(backend, "clock", None)
    return clock


def holds_slots(backend: object) -> TypeGuard[SlotStore]:
    """Whether ``backend`` holds concurrency slots: it has :class:`SlotStore`'s methods and
    does not say otherwise (``holds_slots`` false, as a synced Postgres store says)."""
    return isinstance(backend, SlotStore) and bool(getattr(backend, "holds_slots", True))


Admit = Callable[[Plan], "Decision | None"]
"""A store's decision without a coroutine: ``None`` when admitted and recorded, the refusal
otherwise (``MemoryBackend.admit``)."""
Admitter = Callable[[CompiledTree, Algorithm], "Admit | None"]
"""``admitter(compiled, algorithm)``: a store's :data:`Admit` for plans of that tree, or
``None`` where it has none (a coroutine decides them)."""


def admitting(backend: object) -> Admitter | None:
    """``backend.admitter`` when its admissions decide as ``backend.decide`` does
    (:func:`shortcut`)."""
    admitter: Admitter | None = shortcut(backend, "admitter", "decide")
    return admitter


class Forwarded:
    """A method of the store a wrapper holds (its attribute :attr:`TO`), read from that
    store at each use: a class attribute of the wrapper, not ``__getattr__``, because the
    store protocols' ``isinstance`` checks (``SettleStore``, ``OverrideStore``,
    ``PenaltyStore``...) read attributes statically since Python 3.12, so only what the
    wrapper's class holds counts as its capability. :func:`shortcut` looks through it."""

    TO = "store"

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, wrapper: object, owner: type | None = None) -> Any:
        return self if wrapper is None else getattr(getattr(wrapper, self.TO), self.name)


def shortcut(backend: object, name: str, general: str) -> Any | None:
    """``backend``'s method ``name``, a shortcut to what its method ``general`` does, when
    the class that defines it defines the ``general`` in force too; else ``None`` (a
    subclass overriding ``general`` alone, to count or change what it does, keeps every
    call on it). The direct paths' admissions, and settles started without a task, ask."""
    for cls in type(backend).__mro__:
        own = vars(cls)
        if name in own:
            in_force = own.get(general) is getattr(type(backend), general, None)
            if in_force and isinstance(own[name], Forwarded):  # both the wrapped store's
                return shortcut(getattr(backend, Forwarded.TO), name, general)
            return getattr(backend, name) if in_force else None
        if general in own:
            return None
    return None


def check_supported(backend: object, algorithm: Algorithm) -> None:
    """``backend`` decides ``algorithm``, by its ``algorithms`` (the names of those it
    decides; a backend that does not say is trusted), or ``ConfigurationError``."""
    supported = getattr(backend, "algorithms", None)
    if supported is not None and algorithm.name not in supported:
        raise ConfigurationError(
            f"this storage ({type(backend).__name__}) does not decide "
            f"algorithm={algorithm.name!r}; it decides {', '.join(map(repr, sorted(supported)))}"
        )
