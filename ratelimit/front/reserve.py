"""Slots kept for critical work: ``rl.concurrency("100", reserve={"critical": 20})``.

The reserve names priorities, most critical first, and how many slots each keeps for itself
and the priorities before it. A call of priority ``critical`` may take any of the 100 slots;
a call of no listed priority (ordinary, also a priority of ``None`` or ``""``) only the 80
the reserve leaves. Levels nest in the order given (load shedding by priority):
``{"critical": 20, "high": 10}`` lets critical calls use 100, high ones 80 and the rest 70.

The reserve applies to every limit of the string (``"user:5 | 100"``: on each), so each must
leave at least one slot for ordinary calls; stack two ``rl.concurrency`` decorators to
reserve on one limit only. A call's priority is a selector (``priority`` unless
``reserve_by=`` names another), found as any selector is (:mod:`ratelimit.core.selectors`).

Every holder sits in the same slot set: a take compares the holders with its *own* cap (the
count less the slots kept for the priorities before it), so stores need nothing new; renew
and give-back do not read the count. Pure data, as :mod:`ratelimit.core.slots` is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ratelimit.core.selectors import Parameters, SelectorSources, unannotated_first
from ratelimit.core.slots import SlotLimit
from ratelimit.errors import ConfigurationError, SelectorNotFoundError

DEFAULT_BY = "priority"
UNLISTED_WARNED = 32
"""How many priorities that no reserve lists each reserve warns about (once each)."""

logger = logging.getLogger("ratelimit")


class Reserve:
    """Per priority, the slot limits a call of it takes under (its caps)."""

    __slots__ = ("by", "caps", "levels", "ordinary", "unlisted")

    def __init__(
        self, reserve: object, by: object, limits: tuple[SlotLimit, ...], where: str
    ) -> None:
        if not isinstance(reserve, Mapping) or not reserve:
            raise ConfigurationError(
                f"reserve= of {where} must be a non-empty mapping of priority to slots kept, "
                f"such as {{'critical': 20}}, not {reserve!r}"
            )
        if not isinstance(by, str) or not by.isidentifier():
            raise ConfigurationError(
                f"reserve_by= of {where} must name a selector (an identifier such as 'tier'), "
                f"not {by!r}"
            )
        named = {limit.selector for limit in limits}
        if by in named:
            raise ConfigurationError(
                f"reserve_by={by!r} of {where} is also a selector of its limits: a call's "
                "priority must come from a selector of its own"
            )
        levels: list[tuple[str, int]] = []
        for name, kept in reserve.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(
                    f"reserve= of {where}: a priority is non-empty text, not {name!r}"
                )
            if type(kept) is not int or kept < 1:
                raise ConfigurationError(
                    f"reserve= of {where}: priority {name!r} keeps a whole number of slots "
                    f"from 1 up, not {kept!r}"
                )
            levels.append((name, kept))
        total = sum(kept for _, kept in levels)
        for limit in limits:
            if limit.count - total < 1:
                raise ConfigurationError(
                    f"reserve= of {where} keeps {total} slots ({_listed(levels)}) of limit "
                    f"'{limit}', which has {limit.count}: at least 1 must be left for ordinary "
                    "calls (a reserve applies to every limit of the string; stack a second "
                    "rl.concurrency() to reserve on one limit only)"
                )
        self.by = by
        self.levels = tuple(levels)
        self.caps: dict[str, tuple[SlotLimit, ...]] = {}
        above = 0  # slots kept by the levels before this one: not this level's to take
        for name, kept in levels:
            self.caps[name] = _less(limits, above)
            above += kept
        self.ordinary = _less(limits, above)
        self.unlisted: set[str] = set()
        """Priorities given that no level lists, warned about once each."""

    def limits_for(self, priority: str | None) -> tuple[SlotLimit, ...]:
        """The caps a call of ``priority`` takes under (unlisted or ``None``: ordinary)."""
        if not priority:
            return self.ordinary
        caps = self.caps.get(priority)
        if caps is None:
            self._warn_unlisted(priority)
            return self.ordinary
        return caps

    def _warn_unlisted(self, priority: str) -> None:
        """A priority no level lists counts as ordinary: say so once (a misspelling, a
        case, an ``Enum`` given instead of its value), for a few of them."""
        if priority in self.unlisted or len(self.unlisted) >= UNLISTED_WARNED:
            return
        self.unlisted.add(priority)
        logger.warning(
            "ratelimit: priority %r is not one of reserve=%r: such calls are ordinary "
            "(the priorities are compared as text, exactly: pass an Enum's value, or None "
            "for an ordinary call)",
            priority,
            dict(self.levels),
        )

    def findable(
        self, sources: SelectorSources, parameters: Parameters, function: str, key: str
    ) -> None:
        """Raise :class:`SelectorNotFoundError` now when no call of the decorated function
        can give its priority (as :func:`ratelimit.front.wrapping.findable` does for limits)."""
        by = self.by
        if sources.obj is not None or by in sources.keywords or parameters.may_give(by):
            return
        if unannotated_first(parameters.signature):
            return  # maybe an attribute of a first argument (a request): the call tells
        keywords = ", ".join(sources.keywords) or "none"
        raise SelectorNotFoundError(
            by,
            key,
            [f"keyword arguments of concurrency() ({keywords})", f"parameters of {function}"],
            f"the priority selector {by!r} of reserve={dict(self.levels)!r} can come from no "
            f"call of {function}: pass {by}= to concurrency() (None for ordinary calls), give "
            "the function a parameter of that name, or name another with reserve_by=",
        )


def _less(limits: tuple[SlotLimit, ...], kept: int) -> tuple[SlotLimit, ...]:
    return tuple(SlotLimit(limit.count - kept, limit.selector) for limit in limits)


def _listed(levels: list[tuple[str, int]]) -> str:
    return ", ".join(f"{name} {kept}" for name, kept in levels)


def kept_for(
    reserve: object, by: object, limits: tuple[SlotLimit, ...], where: str
) -> Reserve | None:
    """The :class:`Reserve` of ``reserve=`` (``None``: none, and nothing else to do)."""
    if reserve is None:
        if by != DEFAULT_BY:
            raise ConfigurationError(
                f"reserve_by={by!r} of {where} names a priority selector but no reserve= "
                "says what its priorities keep"
            )
        return None
    return Reserve(reserve, by, limits, where)
