"""A griffe extension for the API reference: the docstrings are written for Python's help()
and Sphinx-style roles (``:class:`~ratelimit.Settings```, ``Example::``); the site renders
Markdown, so roles become code spans (``Settings``) and ``::`` a plain colon before its
indented example."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with its roles as code spans and ``Example::`` as ``Example:``."""

    def span(match: re.Match[str]) -> str:
        short, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return re.sub(r"::\n", ":\n", ROLE.sub(span, text))


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
