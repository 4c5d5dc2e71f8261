"""The decision type: kept so that ``from ratelimit.decision import ...`` goes on working;
the module is :mod:`ratelimit.core.decision`."""

from ratelimit.core.decision import Decision as Decision
from ratelimit.core.decision import HeldDecision as HeldDecision
from ratelimit.core.decision import Hook as Hook
from ratelimit.core.decision import LocalSlotRefusal as LocalSlotRefusal
from ratelimit.core.decision import LockRefusal as LockRefusal
from ratelimit.core.decision import RateLimitExceeded as RateLimitExceeded
from ratelimit.core.decision import RuleState as RuleState
from ratelimit.core.decision import make_decision as make_decision
