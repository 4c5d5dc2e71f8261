"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

from hypothesis import strategies as st

from ratelimit import And, Or, Rule
from ratelimit.rules.tree import Node


def trees(rules: st.SearchStrategy[Rule], max_leaves: int) -> st.SearchStrategy[Node]:
    """Rule trees: single rules, or And/Or of two or three subtrees."""

    def combine(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        groups = st.lists(children, min_size=2, max_size=3)
        return st.builds(lambda c: And(*c), groups) | st.builds(lambda c: Or(*c), groups)

    return st.recursive(rules, combine, max_leaves=max_leaves)
