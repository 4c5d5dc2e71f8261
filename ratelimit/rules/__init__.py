"""The rule language: rule trees (:mod:`.tree`: :class:`Rule` leaves combined with
:class:`And` and :class:`Or`, pure data) and the text they are written in (:mod:`.grammar`,
the only module that imports pyparsing). ``to_tree("apikey:100/h & (10/s | 15/m)")`` turns
text into a tree.
"""

from ratelimit.rules.tree import MAX_COUNT as MAX_COUNT
from ratelimit.rules.tree import MAX_SPAN_MS as MAX_SPAN_MS
from ratelimit.rules.tree import MAX_UNIT as MAX_UNIT
from ratelimit.rules.tree import NOT_UNITS as NOT_UNITS
from ratelimit.rules.tree import UNIT_MS as UNIT_MS
from ratelimit.rules.tree import And as And
from ratelimit.rules.tree import Node as Node
from ratelimit.rules.tree import Or as Or
from ratelimit.rules.tree import Rule as Rule
from ratelimit.rules.tree import RuleLike as RuleLike
from ratelimit.rules.tree import map_rules as map_rules
from ratelimit.rules.tree import to_tree as to_tree
