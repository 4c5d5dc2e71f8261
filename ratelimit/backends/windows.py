"""The window counters' layout, in one place for every store that keeps them.

Per identifier and window size ``S`` (microseconds) two slots: window ``i`` spans
``[i*S, (i+1)*S)`` and lives in slot ``i % 2``, so the current window and the one before it
are both held, and a window two sizes old is overwritten by the next one. A store keeps the
slots as four values, in this order (:data:`Slots`)::

    count of slot 0, index of slot 0, count of slot 1, index of slot 1

(``None`` for a slot not held). The memory backend keeps them in a list; Redis keeps them as
four hash fields (``backends/redis/keys.py``, :func:`window_fields`; the scripts'
``lua/_windows.lua``), which ``HMGET`` returns in this same order, as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Slots = Sequence[Any]
"""The four values of one window size: counts and indexes as numbers, or as text (Redis)."""


def empty() -> list[Any]:
    """The slots of a window size that holds nothing yet."""
    return [0.0, None, 0.0, None]


def newest(slots: Slots) -> int:
    """The newest window index held, or -1."""
    return max(-1 if slots[1] is None else int(slots[1]), -1 if slots[3] is None else int(slots[3]))


def counted(slots: Slots, index: int) -> tuple[float, float]:
    """(count of window ``index``, count of window ``index - 1``), 0.0 for one not held."""
    current = previous = 0.0
    for slot in (0, 1):
        held = slots[2 * slot + 1]
        if held is None:
            continue
        held = int(held)
        if held == index:
            current = float(slots[2 * slot])
        elif held == index - 1:
            previous = float(slots[2 * slot])
    return current, previous


def held(slots: Slots) -> dict[int, float]:
    """Every window held: its index and its count."""
    return {
        int(slots[2 * slot + 1]): float(slots[2 * slot])
        for slot in (0, 1)
        if slots[2 * slot + 1] is not None
    }


def slot_of(index: int) -> int:
    """The slot window ``index`` lives in."""
    return index % 2


def hold(slots: list[Any], index: int, count: float) -> None:
    """Hold ``count`` as window ``index``, in its slot (replacing an older window there)."""
    slot = slot_of(index)
    slots[2 * slot] = count
    slots[2 * slot + 1] = index


def settle(slots: list[Any], delta: float, at_index: int, now_index: int) -> None:
    """Settle ``delta`` on one window size, in place: a refund takes up to ``-delta`` back
    from window ``at_index`` (where the call was recorded) while it is held, never below 0;
    an excess is added to window ``now_index``, past the limit."""
    if delta < 0:
        for slot in (0, 1):
            if slots[2 * slot + 1] is not None and int(slots[2 * slot + 1]) == at_index:
                slots[2 * slot] = max(float(slots[2 * slot]) + delta, 0.0)
    elif delta > 0:
        hold(slots, now_index, counted(slots, now_index)[0] + delta)
