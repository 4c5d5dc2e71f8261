"""Applying a penalty (``limit(..., penalty="ip: 5 refusals/10m for 1h")``): a limit's
calls ask the store whether their identifier is held back before the rules decide, and
note each refusal of the rules after.

- **What counts**: a call the limit's rules refused (an override's included, and the
  denial cache's answers, which are the rules' refusals remembered). A degraded refusal
  (the store failed, a command-engine lock timed out) does not count. In shadow mode a
  refusal counts, and a hold is reported (``shadow=True``, logged) but lets the call
  through, as shadow mode does with every refusal. A call that waits its turn (``wait=``,
  ``acquire(wait)``, an HTTP route's ``delay=``) counts once at most: its last refusal,
  when it is refused in the end (:mod:`ratelimit.pipeline.waiting`).
- **A held call** is refused without asking the rules (nothing is counted on the limit's
  counters): ``retry_after`` and ``Decision.penalty`` are the seconds left of the hold. It
  is not a refusal of the rules, so it never extends the hold: a hold ends on time, and
  the count starts again from nothing (fail2ban's way).
- **Cost**: a limit without ``penalty=`` runs exactly as before (its direct path
  included). A limit with one reads the hold without a coroutine on ``memory://``
  (:meth:`Penalizer.unheld`), in the decision's own script call on Redis's script engine
  (``decide_unless_held``: :meth:`Penalizer.asking` on the direct path, the ``hold`` of
  :meth:`Decider.decide` on the general one), else in one store round trip before the
  decision; and notes each refusal in one more. A hold found is
  remembered in the process for up to :data:`RECHECK` seconds (never past its end), so a
  held client hammering one process costs one round trip per ``RECHECK``; a lift
  (``rl.penalties.lift``) reaches the other processes within it.
- **The store fails**: reading a hold that fails reads as the hold this process knows, to
  its end (its trust in it over or not), else as none (the rules' decision then meets the
  failure policy); a refusal that cannot be noted stays a refusal (logged). While
  an outage is under way (the failure policy's), holds are not read from the store (no
  round trip to wait out per call, as ``on_error="local"`` waits none): a hold this
  process knows keeps refusing until it ends, and no new one starts (a degraded refusal
  does not count).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

from ratelimit.backends.base import clock_of, shortcut
from ratelimit.backends.penalty_store import PenaltyHold, PenaltyStore, check_penalties
from ratelimit.core.decision import Decision, HeldDecision, NeverAdmitted
from ratelimit.core.plan import CompiledTree, Identifier, Plan
from ratelimit.errors import BackendError, ConfigurationError
from ratelimit.overrides.lowered import Overriding
from ratelimit.penalties.spec import Penalty, parse_penalty, penalty_selector
from ratelimit.pipeline.decider import Asker, CallKey, Decider, shadow_logger
from ratelimit.pipeline.waiting import waiting_call

RECHECK = 1.0
"""How long a process trusts a hold it found before asking the store again (seconds)."""

REMEMBERED = 10_000
"""The most holds a limiter remembers in-process (a cache of the store's: past it, those
no longer trusted are forgotten, then all)."""

logger = logging.getLogger("ratelimit.penalties")

_Holds = dict[Identifier, tuple[float, float]]


class _NotNamed:
    """The marker of a selector value not found (:data:`NOT_NAMED`)."""

    def __repr__(self) -> str:
        return "NOT_NAMED"


NOT_NAMED = _NotNamed()
"""A penalty selector's value not found among a call's: the rules deciding it do not name it."""
Found = str | None | _NotNamed
_HOLDS: weakref.WeakKeyDictionary[object, _Holds] = weakref.WeakKeyDictionary()


def _holds(decider: Decider) -> _Holds:
    """The holds ``decider``'s limiter found, by identifier: until when it trusts them."""
    return _HOLDS.setdefault(decider.denials, {})


def _span(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


class Penalizer:
    """One limit's penalty: :meth:`decide` is :meth:`Decider.decide` with the hold read
    first and the refusal noted after."""

    __slots__ = (
        "_clock",
        "_held_now",
        "_index",
        "_targets",
        "_unless_held",
        "decider",
        "held_by",
        "penalty",
        "selector",
        "store",
    )

    def __init__(
        self, decider: Decider, penalty: Penalty, selectors: tuple[str, ...], where: str
    ) -> None:
        self.store: PenaltyStore = check_penalties(decider.backend)
        self.decider = decider
        self.penalty = penalty
        self.selector = penalty_selector(penalty, selectors, where)
        self.held_by = (
            f" after {penalty.count} refusals within {_span(penalty.span_ms)} (penalty '{penalty}')"
        )
        self._clock = clock_of(decider.backend) or time.monotonic
        self._index: dict[CompiledTree, int | None] = {}
        self._held_now: Callable[[Identifier], bool] | None = shortcut(
            self.store, "held_now", "penalty_left"
        )
        self._targets: dict[tuple[str, str | None], Identifier | None] = {}
        self._unless_held: Callable[[Plan, Identifier], Awaitable[Decision | float]] | None = (
            _unless_held(self.store)
        )

    @property
    def direct(self) -> bool:
        """Whether the direct path decides this limit's calls (:meth:`unheld`): its store
        tells a hold without a coroutine (``held_now``: ``memory://``), or reads it in the
        same step as the decision (``decide_unless_held``: Redis's script engine,
        :meth:`asking`)."""
        return self._held_now is not None or self._unless_held is not None

    def unheld(self, compiled: CompiledTree, key: str, values: tuple[str | None, ...]) -> Any:
        """For the direct path of a limit of ``compiled`` under ``key``: the identifier a
        call of ``values`` may be held back as (``None``: none; its refusal counts
        nowhere) when nothing holds it back now, told without a coroutine; ``False`` when
        a hold may (this process trusts one, the store keeps one, or the store fails): the
        general path (:meth:`decide`) answers it. Where the store reads the hold with the
        decision instead (:meth:`asking`), only this process's holds are looked at here."""
        held_now = self._held_now
        if not self.direct or self.decider.policy.outage_started is not None:
            return False
        value = None if self.selector is None else self.value_in(compiled, values)
        by = (key, value if isinstance(value, str) else None)
        if by in self._targets:
            target = self._targets[by]
        else:
            if len(self._targets) >= REMEMBERED:
                self._targets.clear()
            namespace = self.decider.namespace
            if self.selector is None:
                target = Identifier(namespace, key, None, None)
            elif isinstance(value, str) and value:
                target = Identifier(namespace, key, self.selector, value)
            else:
                target = None
            self._targets[by] = target
        if target is None:
            return None
        if target in _holds(self.decider) or (held_now is not None and held_now(target)):
            return False
        return target

    def free(self, compiled: CompiledTree, key: str) -> Callable[[str], bool] | None:
        """For the fused path of a limit of ``compiled`` (one selector) under ``key``:
        whether nothing holds back a call of a selector value now (:meth:`unheld`, as the
        direct path asks it; an admission is then all there is to it), where the store
        tells a hold without a coroutine (``held_now``); ``None`` elsewhere."""
        if self._held_now is None:
            return None
        unheld = self.unheld

        def free(value: str) -> bool:
            return unheld(compiled, key, (value,)) is not False

        return free

    def asking(self, target: Identifier | None, shadow: bool) -> Asker | None:
        """For the direct path, what asks the store to decide a call of ``target``
        (:meth:`unheld`) with its hold read in the same step (``Decider.ask``'s ``hold``:
        a :class:`HeldDecision` while it lasts); ``None`` where :meth:`unheld` read it
        already (``held_now``), or nothing holds the call back."""
        if target is None or self._held_now is not None:
            return None
        return functools.partial(self._ask_unless_held, target, None, shadow)

    async def noted(self, target: Identifier | None, decision: Decision) -> Decision:
        """What :meth:`decide` makes of a refusal of the rules the direct path decided for
        ``target`` (:meth:`unheld`): noted (the refusal, or held if it starts a hold),
        unless it counts nowhere (no target, degraded, a cost never admitted)."""
        if target is None or decision.degraded or decision.__class__ is NeverAdmitted:
            return decision
        return await self._note(target, decision)

    def value_in(self, compiled: CompiledTree, values: tuple[str | None, ...]) -> Found:
        """The value of this penalty's selector among ``values`` (of ``compiled``'s
        selectors); :data:`NOT_NAMED` when ``compiled`` does not name it."""
        index = self._index.get(compiled, -1)
        if index == -1:
            names = [s.split("#", 1)[0] for s in compiled.selectors]
            index = self._index[compiled] = (
                names.index(self.selector) if self.selector in names else None
            )
        return NOT_NAMED if index is None else values[index]

    def target(self, call: CallKey, value: Found = NOT_NAMED) -> Identifier | None:
        """The identifier ``call`` may be held back as: the whole key, or the value of this
        penalty's selector (``value``, found by the front end for the limit's own rules;
        else among ``call``'s). ``None`` when that value is not found or empty: the call is
        then not held, and its refusal counts nowhere."""
        if self.selector is None:
            return Identifier(call.namespace, call.key, None, None)
        if value is NOT_NAMED:
            value = self.value_in(call.compiled, call.values)
        if not isinstance(value, str) or not value:  # not named, unresolved or empty
            return None
        return Identifier(call.namespace, call.key, self.selector, value)

    def held(self, key: str, left: float, shadow: bool) -> Decision:
        """The refusal of a call held back ``left`` more seconds."""
        decision = HeldDecision(False, left, None, 0, key, penalty=left, held_by=self.held_by)
        if shadow:
            shadow_logger.info(
                "ratelimit: shadow mode let through a call of key %r held back by penalty '%s'",
                key,
                self.penalty,
            )
            decision = dataclasses.replace(decision, shadow=True)
        return decision

    def _told_held(self, key: str, left: float, shadow: bool) -> Decision:
        """:meth:`held`, told to the hooks (a hold known before the store was asked)."""
        decision = self.held(key, left, shadow)
        if self.decider.hooks:
            self.decider.hooks(decision, 0.0)
        return decision

    async def hold_left(self, target: Identifier) -> float:
        """Seconds left of ``target``'s hold: remembered here, else the store's."""
        failing = self.decider.policy.outage_started is not None
        now = self._clock()
        left, trusted = self._trusted(target, now, failing)
        if left > 0:
            return left
        if failing:  # the store fails: not asked; a hold known here lasts to its end
            return 0.0
        try:
            left = await self.store.penalty_left(target)
        except BackendError:
            # a hold known here lasts to its end while the store fails, noticed or not;
            # none known: the rules' decision meets the failure (the failure policy)
            return 0.0 if trusted is None else max(0.0, trusted[1] - self._clock())
        if left > 0:
            self._remember(target, left, now)
        elif trusted is not None:
            _holds(self.decider).pop(target, None)  # lifted at the store
        return left

    def _trusted(
        self, target: Identifier, now: float, failing: bool
    ) -> tuple[float, tuple[float, float] | None]:
        """The seconds left of a hold of ``target`` this process trusts now (0: none, the
        store is to be asked; while the store ``failing``, one known lasts to its end),
        and the hold it knows, not yet ended (forgotten once it has)."""
        holds = _holds(self.decider)
        trusted = holds.get(target)
        if trusted is None:
            return 0.0, None
        if trusted[0] > now or (failing and trusted[1] > now):
            return trusted[1] - now, trusted
        if trusted[1] <= now:
            del holds[target]  # ended
            return 0.0, None
        return 0.0, trusted

    def _remember(self, target: Identifier, left: float, now: float) -> None:
        holds = _holds(self.decider)
        if len(holds) >= REMEMBERED:  # many held clients: forget those no longer trusted
            for stale in [t for t, (trusted, _) in holds.items() if trusted <= now]:
                del holds[stale]
            if len(holds) >= REMEMBERED:
                holds.clear()
        holds[target] = (now + min(left, RECHECK), now + left)

    async def decide(
        self,
        call: CallKey,
        record: bool = True,
        shadow: bool = False,
        within: float | None = None,
        override: Overriding = False,
        value: Found = NOT_NAMED,
    ) -> Decision:
        """:meth:`Decider.decide <ratelimit.pipeline.decider.Decider.decide>` under the penalty
        (``record=False``: a peek, which shows a hold and notes nothing). ``value``: the
        value of the penalty's selector for the limit's own rules, when the rules deciding
        the call may not name it (an override's, rules chosen per call): :meth:`target`."""
        decider = self.decider
        target = self.target(call, value)
        if target is None:
            return await decider.decide(call, record, shadow, within, override)
        decider.check_open()
        if (
            self._unless_held is not None
            and record
            and within is None
            and override.__class__ is bool
            and decider.background is None
            and decider.policy.outage_started is None
            and not (decider.denials.held and decider.denials.get(call) is not None)
        ):  # the hold read in the store's decision of the rules: one step
            decision = await self._decide_unless_held(call, target, shadow, override)
            if decision.__class__ is HeldDecision:
                return decision
            return await self._noted(target, decision)
        left = await self.hold_left(target)
        if left > 0:
            return self._told_held(call.key, left, shadow)
        decision = await decider.decide(call, record, shadow, within, override)
        return await self._noted(target, decision) if record else decision

    async def _noted(self, target: Identifier, decision: Decision) -> Decision:
        """:meth:`decide`'s ``decision`` of the rules, noted when it is a refusal that
        counts (not degraded, a cost they admit): at once, or when a call that waits its
        turn is refused in the end."""
        if (
            decision.allowed
            or decision.degraded
            or decision.__class__ is NeverAdmitted  # its cost, not the client's rate
        ):
            return decision
        waiting = waiting_call()
        if waiting is not None:  # a call that waits: only its last refusal counts
            waiting.pending = functools.partial(self._note, target)
            return decision
        return await self._note(target, decision)

    async def _decide_unless_held(
        self, call: CallKey, target: Identifier, shadow: bool, override: Overriding
    ) -> Decision:
        """:meth:`decide` where the store reads the hold in its decision
        (``decide_unless_held``): a hold this process trusts answers first, as in
        :meth:`hold_left`; else one step asks both."""
        left, trusted = self._trusted(target, self._clock(), False)
        if left > 0:
            return self._told_held(call.key, left, shadow)
        asker = functools.partial(self._ask_unless_held, target, trusted, shadow)
        return await self.decider.decide(call, True, shadow, None, override, hold=asker)

    async def _ask_unless_held(
        self, target: Identifier, trusted: tuple[float, float] | None, shadow: bool, plan: Plan
    ) -> Decision:
        """The store's answer for ``plan`` held back by ``target``'s hold: the hold's
        refusal (remembered here) while it lasts, else the rules' decision. A hold this
        process knows lasts to its end while the store fails."""
        assert self._unless_held is not None
        try:
            answer = await self._unless_held(plan, target)
        except BackendError:
            left = 0.0 if trusted is None else trusted[1] - self._clock()
            if left > 0:
                return self.held(plan.key, left, shadow)
            raise  # the failure policy answers
        if answer.__class__ is float:
            left = answer
            self._remember(target, left, self._clock())
            return self.held(plan.key, left, shadow)
        if trusted is not None:
            _holds(self.decider).pop(target, None)  # lifted at the store
        return cast(Decision, answer)

    async def _note(self, target: Identifier, decision: Decision) -> Decision:
        """Note ``decision``, a refusal of the rules: the refusal, or held if it starts a
        hold."""
        penalty = self.penalty
        try:
            started = await self.store.note_refusal(
                target, penalty.count, penalty.span_ms, penalty.hold_ms
            )
        except BackendError as exc:
            logger.warning("ratelimit: a refusal of key %r not noted: %s", decision.key, exc)
            started = 0.0
        if started > 0:
            self._remember(target, started, self._clock())
            return self.held(decision.key, started, decision.shadow)
        return decision


def _unless_held(store: object) -> Any | None:
    """``store``'s ``decide_unless_held`` (the hold read in the decision's own step), when
    neither ``decide`` nor ``penalty_left`` is overridden below the class that defines it
    (:func:`~ratelimit.backends.base.shortcut`): a subclass that reads holds, or decides,
    its own way keeps every call on its methods."""
    found = shortcut(store, "decide_unless_held", "decide")
    if found is None:
        return None
    mro = type(store).__mro__

    def defined(name: str) -> int:  # where in the MRO the method in force is defined
        return next(i for i, cls in enumerate(mro) if name in vars(cls))

    return found if defined("penalty_left") >= defined("decide_unless_held") else None


def penalizer_for(decider: Decider, penalty: object, rules: Any, where: str) -> Penalizer | None:
    """The penalizer of a limit made with ``penalty=`` (``None``: none), checked now:
    the text, the store, the selector among those ``rules`` name (a compiled tree, or
    rules chosen per call: every tree's selectors)."""
    if penalty is None:
        return None
    parsed = parse_penalty(penalty)
    if rules is None:
        raise ConfigurationError(
            f"penalty '{parsed}' of {where} needs the limit's own rules (limit(rules, "
            "key=..., penalty=...)), not rules registered under key= elsewhere"
        )
    if getattr(rules, "function", None) is not None:  # rules chosen per call by a function
        if parsed.selector is None:
            raise ConfigurationError(
                f"penalty '{parsed}' of {where}: the rules are chosen per call by a function, "
                "so the selector it holds back cannot be read from them; name the selector "
                f"it holds back, such as 'apikey: {parsed}'"
            )
        return Penalizer(decider, parsed, (parsed.selector,), where)
    trees = getattr(rules, "trees", (rules,))
    selectors = tuple(s for tree in trees for s in tree.selectors)
    return Penalizer(decider, parsed, selectors, where)


class Penalties:
    """A namespace's penalties in force, kept in the limiter's store: ``rl.penalties``.

    Example::

        for hold in await rl.penalties.list():
            print(hold.key, hold.selector, hold.value, f"{hold.left:.0f} s left")
        await rl.penalties.lift("login", ip="203.0.113.9")   # or every hold of "login"
    """

    __slots__ = ("_decider",)

    def __init__(self, decider: Decider) -> None:
        self._decider = decider

    def check(self) -> None:
        """``ConfigurationError`` unless the limiter's store keeps penalties."""
        check_penalties(self._decider.backend)

    def penalizer(self, penalty: str, selectors: tuple[str, ...], where: str) -> Penalizer:
        """A :class:`Penalizer` of ``penalty`` on this limiter, for a front end that builds
        its own calls (the service), checked as ``limit(penalty=...)`` checks it."""
        return Penalizer(self._decider, parse_penalty(penalty), selectors, where)

    async def list(self, key: str | None = None) -> list[PenaltyHold]:
        """The holds in force (of ``key`` only, if given): key, selector, value, seconds
        left. ``ConfigurationError`` on a store that keeps no penalties."""
        self._decider.check_open()
        return await check_penalties(self._decider.backend).list_penalties(
            self._decider.namespace, key
        )

    async def lift(self, key: str, **value: str) -> int:
        """End the hold of ``key``'s ``selector=value`` now (one keyword), or every hold
        of ``key`` (none); returns how many were lifted. This process forgets them at
        once; other processes within :data:`RECHECK` seconds."""
        if len(value) > 1:
            raise TypeError(f"lift() takes one selector=value, not {sorted(value)}")
        self._decider.check_open()
        store = check_penalties(self._decider.backend)
        ((selector, text),) = value.items() if value else ((None, None),)
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{selector}= must be text, not {type(text).__name__}")
        holds = _holds(self._decider)
        for target in [t for t in holds if t.key == key]:
            if selector is None or (target.selector, target.value) == (selector, text):
                del holds[target]
        return await store.lift_penalties(self._decider.namespace, key, selector, text)


_MADE: weakref.WeakKeyDictionary[object, dict[tuple[str, CompiledTree, str], Penalizer]] = (
    weakref.WeakKeyDictionary()
)


def penalizer_cached(decider: Decider, penalty: str, compiled: CompiledTree, key: str) -> Penalizer:
    """The penalizer of ``penalty`` for ``RateLimit.decide`` of ``compiled`` under ``key``:
    made (and checked) at its first use, then kept for the limiter."""
    made = _MADE.setdefault(decider.denials, {})
    found = made.get((penalty, compiled, key))
    if found is None:
        found = penalizer_for(decider, penalty, compiled, f"key {key!r}")
        assert found is not None
        if len(made) >= 1024:
            made.clear()
        made[(penalty, compiled, key)] = found
    return found
