"""Plans (what a backend must decide for one call): kept so that ``from ratelimit.plan
import ...`` goes on working; the module is :mod:`ratelimit.core.plan`."""

from ratelimit.core.plan import OP_AND as OP_AND
from ratelimit.core.plan import OP_LEAF as OP_LEAF
from ratelimit.core.plan import OP_OR as OP_OR
from ratelimit.core.plan import PLANS as PLANS
from ratelimit.core.plan import CompiledTree as CompiledTree
from ratelimit.core.plan import Cost as Cost
from ratelimit.core.plan import CounterUpdate as CounterUpdate
from ratelimit.core.plan import Identifier as Identifier
from ratelimit.core.plan import Plan as Plan
from ratelimit.core.plan import cached_plan as cached_plan
from ratelimit.core.plan import compile_tree as compile_tree
