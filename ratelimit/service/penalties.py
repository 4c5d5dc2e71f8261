"""Penalties in the service: a rules-file limit's ``penalty = "5 refusals/10m for 1h"``
holds back a descriptor (its values, as the limit counts them) refused that often.

:class:`PenalizingHandlers` is :class:`~ratelimit.service.handlers.Handlers` with the
hold read before each group of descriptors is decided and the refusals noted after: a
group with a held descriptor is answered ``OVER_LIMIT`` (``OK`` for a shadow limit),
counting nothing, and its answer's ``Retry-After`` (the response headers) is the hold's
time left. A group without a penalty is decided as before. Holds are kept under the key
``envoy/<domain>``, per descriptor value, so ``ratelimit penalties list`` shows them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ratelimit.core.decision import Decision
from ratelimit.core.plan import Identifier, compile_tree
from ratelimit.errors import BackendError
from ratelimit.penalties.penalizer import Penalizer
from ratelimit.service.handlers import Handlers
from ratelimit.service.rules_file import DescriptorLimit
from ratelimit.service.statuses import Matched

logger = logging.getLogger("ratelimit.service")


@dataclass
class PenalizingHandlers(Handlers):
    """:class:`Handlers` that apply the rules file's penalties. A rules file with a
    penalty on a store that keeps none is refused when the handlers are made."""

    _penalizers: dict[tuple[str, str], Penalizer] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.rules is not None and any(limit.penalty for limit in self.rules.limits):
            self.limiter.penalties.check()

    def _penalizer(self, limit: DescriptorLimit) -> Penalizer:
        assert limit.penalty is not None
        made = self._penalizers.get((limit.penalty, limit.selector))
        if made is None:
            if len(self._penalizers) > 1024:  # rules reloaded many times
                self._penalizers.clear()
            where = f"the rules file's line {limit.line}"
            made = self.limiter.penalties.penalizer(limit.penalty, (limit.selector,), where)
            self._penalizers[(limit.penalty, limit.selector)] = made
        return made

    async def _decide_group(
        self,
        domain: str,
        group: list[Matched],
        shadow: bool,
        record: bool,
        always: bool = False,
    ) -> Decision:
        penalized = [item for item in group if item[1].penalty]
        if not penalized:
            return await super()._decide_group(domain, group, shadow, record, always)
        key = f"envoy/{domain}"
        namespace = self.limiter.namespace
        for _, limit, value, _ in penalized:
            penalizer = self._penalizer(limit)
            target = Identifier(namespace, key, limit.selector, value)
            left = await penalizer.hold_left(target)
            if left > 0:
                return penalizer.held(key, left, shadow)
        decision = await super()._decide_group(domain, group, shadow, record, always)
        if not record or decision.allowed or decision.degraded:
            return decision
        limited = _limited_descriptors(group, decision)
        for i, (_, limit, value, _) in enumerate(group):
            if not limit.penalty or i not in limited:
                continue
            penalizer = self._penalizer(limit)
            penalty = penalizer.penalty
            target = Identifier(namespace, key, limit.selector, value)
            try:
                await penalizer.store.note_refusal(
                    target, penalty.count, penalty.span_ms, penalty.hold_ms
                )
            except BackendError as exc:
                logger.warning("ratelimit: a refusal of key %r not noted: %s", key, exc)
        return decision


def _limited_descriptors(group: list[Matched], decision: Decision) -> set[int]:
    """The positions in ``group`` of the descriptors whose own rules refused."""
    leaf_owner: list[int] = []
    for i, (_, limit, _, _) in enumerate(group):
        leaf_owner += [i] * len(compile_tree(limit.rules).rules)
    return {leaf_owner[state.leaf] for state in decision.states if state.limited}
