"""What every algorithm is to the layers around it: :class:`Algorithm`.

An algorithm is chosen once, when the limiter is made (``Settings.algorithm`` names it,
:func:`~ratelimit.algorithms.named` gives the object), and travels with every plan
(:attr:`~ratelimit.core.plan.Plan.algorithm`). Every layer asks the object, never its name:

- the limiter checks costs and rules with :meth:`Algorithm.check_cost_type`,
  :meth:`Algorithm.check_rule` and :meth:`Algorithm.check_cost`;
- plans list window sizes only where :attr:`Algorithm.windowed`;
- :mod:`ratelimit.core.evaluation` turns what storage counted into an :data:`Outcome` with
  :meth:`Algorithm.outcome`, and into per-rule states with :meth:`Algorithm.reset_us`;
- each backend keeps a table from :attr:`Algorithm.name` to its own code for it (its
  ``algorithms``), which says what it supports.
"""

from __future__ import annotations

import math
from typing import ClassVar

from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import Rule

US_PER_MS = 1000

Outcome = tuple[bool, int, float | None, int | None]
"""One rule's outcome: limited, retry after (us), what is left before this call (``None``: no
limit applies), binding leaf index (``None``: no rule applies)."""

Counted = tuple[float, float]
"""What storage counted for one leaf, two numbers whose meaning is the algorithm's."""


class Algorithm:
    """One algorithm: what it stores per identifier, how a count becomes an
    :data:`Outcome`, what it accepts as cost, and its checks. Instances are shared and
    compared by identity; ``str()`` is the name ``Settings.algorithm`` takes.

    Subclasses set the class attributes and implement :meth:`outcome` and
    :meth:`reset_us`; the checks have defaults every algorithm shares.
    """

    __slots__ = ("name",)

    stores: ClassVar[str] = ""
    """What it keeps per identifier, in words, for error messages ("a sliding log")."""
    windowed: ClassVar[bool] = False
    """Whether it counts per window size: plans then list each identifier's sizes."""
    whole_costs: ClassVar[bool] = True
    """Whether a call's cost must be a whole number of hits."""
    syncable: ClassVar[bool] = False
    """Whether its counts merge from diffs (``sync_rate > 0``: local counters synced later)."""
    bursts: ClassVar[bool] = False
    """Whether a rule may name a ``burst``."""
    stamps: ClassVar[bool] = False
    """Whether it keeps the time of each hit (the sliding log): a lease's calls are stamped
    again when it ends (:mod:`ratelimit.backends.leases`)."""
    leases: ClassVar[bool] = True
    """Whether calls may be admitted from leases (:mod:`ratelimit.backends.leases`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<algorithm {self.name!r}>"

    def __str__(self) -> str:
        return self.name

    def outcome(self, rule: Rule, leaf: int, cost: float, counted: Counted, now_us: int) -> Outcome:
        """Leaf ``leaf``'s outcome for a call of ``cost``, from what storage counted."""
        raise NotImplementedError

    def reset_us(
        self, rule: Rule, counted: Counted, now_us: int, used: float, remaining: int
    ) -> float:
        """Microseconds until a rule that admits, with ``remaining`` left after the call
        (which counted ``used``: its cost when admitted, else 0), has one more to give; the
        whole span when nothing is counted."""
        raise NotImplementedError

    def check_cost_type(self, cost: object) -> None:
        """A cost this algorithm can count: a whole number of hits, 1 or more, where
        :attr:`whole_costs`; else any finite number above 0."""
        if self.whole_costs:
            if type(cost) is not int or cost < 1:
                raise ConfigurationError(
                    f"cost must be a whole number of hits, 1 or more, not {cost!r} "
                    "(fractions need algorithm='sliding-window' or 'fixed-window', a setting of "
                    "the limiter: RateLimit.from_url(url, algorithm=...))"
                )
        elif type(cost) not in (int, float) or not 0 < cost < math.inf:  # type: ignore[operator]
            raise ConfigurationError(f"cost must be a number of hits above 0, not {cost!r}")

    def check_rule(self, rule: Rule, cost: float) -> None:
        """``rule`` can be kept, and can admit a call of ``cost``."""
        if rule.burst is not None and not self.bursts:
            raise ConfigurationError(
                f"rule '{rule}' names a burst, which only algorithm='gcra' has (this limiter "
                f"uses {self.name!r}); drop 'burst {rule.burst}' or use algorithm='gcra'"
            )
        if cost > rule.count:
            raise ConfigurationError(
                f"cost {cost} is above the count of rule '{rule}': such a call could never "
                "be admitted"
            )

    def check_cost(self, cost: float) -> None:
        """A cost one call may count, whatever its rules (after :meth:`check_rule`)."""

    def check_actual(self, actual: object) -> None:
        """What a settled call really counted (``settle``): a whole number of hits, 0 or
        more, where :attr:`whole_costs`; else any finite number from 0. No upper bound:
        an excess is recorded past the limit."""
        if self.whole_costs:
            if type(actual) is not int or actual < 0:
                raise ConfigurationError(
                    f"a settled cost must be a whole number of hits, 0 or more, not {actual!r}"
                )
        elif type(actual) not in (int, float) or not 0 <= actual < math.inf:  # type: ignore[operator]
            raise ConfigurationError(f"a settled cost must be a number from 0, not {actual!r}")

    def refundable(
        self, rule: Rule, reserved: float, counted: Counted, at_us: int, refund: float
    ) -> float:
        """How much of ``refund`` a settle may take back from what a call of ``reserved``
        recorded at ``at_us`` on ``rule`` (``counted``: what storage counted before it):
        all of it, unless the algorithm recorded less than the cost (GCRA)."""
        return refund

    def held_until(self, rule: Rule, reserved: float, counted: Counted, at_us: int) -> Counted:
        """Until when what a call of ``reserved`` recorded at ``at_us`` on ``rule`` still
        counts, where the algorithm drains it (GCRA: the arrival time the call pushed
        its rule's to; a refund never gives back what has drained since); ``(0, 0)``
        where a refund finds what still counts in the store itself."""
        return (0, 0)
