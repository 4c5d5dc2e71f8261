"""Hooks: callables told of every decision, for metrics and logs.

A hook is any ``Callable[[Decision], object]``: it sees ``allowed``, ``degraded``, ``rule``,
``key`` and ``retry_after``. Hooks run on the request path after each decision, in order;
keep them cheap (count, don't send). One that raises is logged once and otherwise ignored:
a broken metric never breaks a rate limit.

A hook that also wants each decision's latency has a ``timed(decision, seconds)`` method,
which is called instead (``seconds``: the time the decision pipeline took, storage
included); :class:`ratelimit.metrics.OpenTelemetryHook` is one.

Example::

    allowed = denied = 0

    def count(decision: Decision) -> None:
        nonlocal allowed, denied
        if decision.allowed:
            allowed += 1
        else:
            denied += 1

    rl = RateLimit(client, hooks=[count])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ratelimit.decision import Decision

Hook = Callable[[Decision], object]

logger = logging.getLogger("ratelimit")


class Hooks:
    """The hooks of one ``RateLimit``, each called with every decision."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        for hook in hooks:
            if not callable(hook):
                raise TypeError(f"a hook must be callable, not {type(hook).__name__}")
        self._hooks = tuple(hooks)
        self._timed = tuple(getattr(hook, "timed", None) for hook in hooks)
        self.timed = any(self._timed)
        """Whether a hook wants latencies (the pipeline then reads the clock)."""
        self._failed: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def __call__(self, decision: Decision, seconds: float = 0.0) -> None:
        for n, (hook, timed) in enumerate(zip(self._hooks, self._timed, strict=True)):
            try:
                if timed is not None:
                    timed(decision, seconds)
                else:
                    hook(decision)
            except Exception:
                if n not in self._failed:  # once per hook, not once per decision
                    self._failed.add(n)
                    logger.exception("ratelimit: hook %r failed; it stays installed", hook)
