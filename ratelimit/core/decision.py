"""The one result type every backend returns and every front end reads, and the exception
that carries it when a raising front end refuses a call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ratelimit.errors import RateLimitError
from ratelimit.rules.tree import Rule


class RuleState(NamedTuple):
    """One rule of the tree as a decision left it: what HTTP's ``RateLimit`` header field and
    a gateway's per-descriptor status report.

    - ``rule``: the rule; ``leaf`` its position among the tree's rules (left to right).
    - ``limited``: the rule refused the call (alone it would have refused it).
    - ``remaining``: hits this rule still admits now, after this call when it was admitted
      (or peeked at); ``0`` when limited.
    - ``reset_after``: seconds during which the rule admits no more than ``remaining``;
      quota starts coming back after them. When limited, the seconds until it admits the
      call again. Sliding log: until the oldest counted hit leaves the window. Fixed window:
      until the window ends. Sliding window: until the weighted count has fallen by one.
      With nothing counted, the rule's whole span.
    """

    rule: Rule
    leaf: int
    limited: bool
    remaining: int
    reset_after: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a call was admitted, and what the caller may want to tell its own caller.

    - ``allowed``: the call was admitted and its hit recorded (a denied call records nothing).
    - ``retry_after``: seconds until the same call would be admitted if nothing else
      happened; ``0.0`` when allowed. Never negative.
    - ``rule``: the rule that decided: for a denial the limited rule that holds longest
      (``Or``) or frees first (``And``); when allowed, the rule with the fewest calls left.
      ``None`` when no rule applied (every selector resolved to ``None``).
    - ``remaining``: calls still admitted right now after this one; ``0`` when denied;
      ``None`` when nothing limits the call.
    - ``key``: the limit's key.
    - ``degraded``: the storage failed and the failure policy (``on_error``) decided
      instead. The hit may still have been counted, if the storage did its part before
      the failure reached the caller (see the docs, "When the store fails"). Also set on
      the refusal of a call whose command-engine lock stayed held past ``lock_timeout``
      (nothing counted; refused whatever ``on_error`` says, except ``"raise"``), which
      is a :class:`LockRefusal`.
    - ``shadow``: a refusal in shadow mode: ``allowed`` is ``False`` (what the rules, or
      ``on_error``, decided; nothing was recorded), but the front ends let the call
      through instead of refusing it. Hooks and logs see it, so a new limit can be
      watched before it is enforced.
    - ``override``: the rules that decided were an override's (``rl.overrides``), in
      force for this call instead of the limit's own; ``rule`` and ``states`` are its.
    - ``penalty``: the call was held back by the limit's ``penalty=`` (its identifier was
      refused too often): the seconds left of the hold, which ``retry_after`` also says
      (the rules were not asked, nothing was counted); ``None`` otherwise.
    - ``states``: per rule of the tree that applied (its selector resolved), what it has
      left and when that changes: :class:`RuleState`, left to right. Computed when first
      read, from what the storage already answered (no second round trip). Empty when no
      storage counted (fail-open, the denial cache's own answers keep the storage's).

    Example::

        decision = await rl.limit("10/s", key="search").decide()
        if not decision.allowed:
            print(f"try again in {decision.retry_after:.1f} s")
    """

    allowed: bool
    retry_after: float
    rule: Rule | None
    remaining: int | None
    key: str
    degraded: bool = False
    shadow: bool = False
    override: bool = False
    penalty: float | None = None
    _states: tuple[RuleState, ...] | Callable[[], tuple[RuleState, ...]] | None = field(
        default=None, compare=False, repr=False
    )
    _reservation: list[Any] | None = field(default=None, compare=False, repr=False)
    """What settling the call needs (:mod:`ratelimit.core.settling`): ``[plan, decided at (us),
    counts]`` for an admitted call that recorded its cost, ``[Settling]`` once a settle took
    it; ``None`` when nothing was recorded."""

    @property
    def states(self) -> tuple[RuleState, ...]:
        """Per rule of the tree that applied: its :class:`RuleState`."""
        states = self._states
        if states is None:
            return ()
        if callable(states):
            states = states()
            _STATES(self, states)  # computed once; the decision stays as it was
        return states


@dataclass(frozen=True, slots=True)
class LockRefusal(Decision):
    """A refusal because the command engine's lock (``use_scripts=False``) stayed held past
    ``lock_timeout``: contention on a store that answers, not an outage, so refused under
    any ``on_error`` but ``"raise"`` (``degraded=True``, nothing counted). Only the
    refusal's message tells it apart from a :class:`Decision`."""


@dataclass(frozen=True, slots=True)
class HeldDecision(Decision):
    """A refusal by a penalty's hold (:mod:`ratelimit.penalties.penalizer`): ``penalty`` is set;
    ``held_by`` says why, for the refusal's message."""

    held_by: str = ""
    """`` after K refusals within SPAN (penalty '...')``."""


@dataclass(frozen=True, slots=True)
class NeverAdmitted(Decision):
    """A refusal of a call whose cost its rules can never admit (a cost the caller chose,
    above a rule's count, or above what the algorithm counts in one call:
    :mod:`ratelimit.overrides.lowered`). Nothing was counted and retrying the same call
    never helps, so the HTTP front ends send no ``Retry-After``; ``retry_after`` is the
    rule's span, when other rules might be in force. ``why`` says what, for the refusal's
    message and problem details."""

    why: str = ""


@dataclass(frozen=True, slots=True)
class LocalSlotRefusal(Decision):
    """A concurrency take refused under ``on_error="local"`` while the store fails: this
    process's local share of the slots is full (``degraded=True``). A refusal of the
    limit, not the storage's (429 at the HTTP edge, as a local refusal of a rate rule)."""


_new = object.__new__
_ALLOWED, _RETRY_AFTER, _RULE, _REMAINING, _KEY = (
    Decision.__dict__[name].__set__
    for name in ("allowed", "retry_after", "rule", "remaining", "key")
)
_DEGRADED = Decision.__dict__["degraded"].__set__
_SHADOW = Decision.__dict__["shadow"].__set__
_OVERRIDE = Decision.__dict__["override"].__set__
_PENALTY = Decision.__dict__["penalty"].__set__
_STATES = Decision.__dict__["_states"].__set__
_RESERVATION = Decision.__dict__["_reservation"].__set__


def make_decision(
    allowed: bool,
    retry_after: float,
    rule: Rule | None,
    remaining: int | None,
    key: str,
    states: tuple[RuleState, ...] | Callable[[], tuple[RuleState, ...]] | None = None,
    reservation: list[Any] | None = None,
) -> Decision:
    """``Decision(...)`` at half the cost, for the hot path: a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``; this sets the slots directly. The result
    is the same immutable ``Decision``."""
    decision = _new(Decision)
    _ALLOWED(decision, allowed)
    _RETRY_AFTER(decision, retry_after)
    _RULE(decision, rule)
    _REMAINING(decision, remaining)
    _KEY(decision, key)
    _DEGRADED(decision, False)
    _SHADOW(decision, False)
    _OVERRIDE(decision, False)
    _PENALTY(decision, None)
    _STATES(decision, states)
    _RESERVATION(decision, reservation)
    return decision


class RateLimitExceeded(RateLimitError, RuntimeError):
    """A call was refused: its rules are limited. The guarded code did not run.

    ``retry_after`` is the number of seconds until the same call would be admitted if
    nothing else happened; ``rule`` is the rule that decided; ``key`` the limit's key.
    """

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.retry_after: float = decision.retry_after
        self.rule: Rule | None = decision.rule
        self.key: str = decision.key
        if isinstance(decision, LockRefusal):
            what = (
                f"call refused for key {decision.key!r}: the command engine's lock stayed held "
                "past lock_timeout, which refuses under any on_error (use_scripts=False: "
                "contention, not an outage)"
            )
        elif decision.penalty is not None:
            why = decision.held_by if isinstance(decision, HeldDecision) else ""
            what = (
                f"call refused for key {decision.key!r}: held back for "
                f"{decision.penalty:.0f} s{why}"
            )
        elif isinstance(decision, NeverAdmitted):
            super().__init__(
                f"call refused for key {decision.key!r}: {decision.why}, so it is never "
                "admitted (nothing was counted; retrying the same call will not help)"
            )
            return
        elif isinstance(decision, LocalSlotRefusal):
            what = (
                f"call refused for key {decision.key!r}: the rate-limit storage failed and "
                "this process's local share of its concurrency slots is taken (on_error="
                "'local' decides in-process until the storage answers)"
            )
        elif decision.degraded and decision.rule is not None:  # on_error="local"'s refusal
            what = (
                f"call refused for key {decision.key!r}: the rate-limit storage failed and "
                f"this process's local share of rule '{decision.rule}' is used up "
                "(on_error='local' decides in-process until the storage answers)"
            )
        elif decision.degraded:
            what = (
                f"call refused for key {decision.key!r}: the rate-limit storage failed and "
                "on_error='deny' refuses calls until it answers"
            )
        elif decision.rule is None:  # a backend of one's own may refuse without a rule
            what = f"rate limit exceeded for key {decision.key!r}"
        else:
            what = f"rate limit exceeded for key {decision.key!r} by rule '{decision.rule}'"
        super().__init__(f"{what}; retry after {decision.retry_after:.3f} s")


Hook = Callable[[Decision], object]
"""A callable told of every decision (``RateLimit(hooks=[...])``): what it returns is
ignored (:mod:`ratelimit.pipeline.hooks` calls them)."""
